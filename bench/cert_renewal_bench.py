"""Certificate renewal benchmark: identities from OpenBao, renewed without a restart.

Brings up the secure box (`sco dev up --profile secure`: its own TLS-only PostgreSQL, NATS,
Temporal behind nginx, and a real OpenBao issuing every process's certificate) with
`identity.ttl_seconds = --ttl`, then for `--duration` keeps calls going while every
process renews at 2/3 of each certificate's lifetime:
- an acquisition every `--acquire-every` seconds through the worker on mTLS Temporal;
- a NATS message a second to a subscription of a renewing identity of the bench's own,
  whose connection is made to reconnect after each of its renewals;
- a new TLS PostgreSQL connection a second with that identity's files.
Figures: time to provision OpenBao on a fresh box and the whole `up`; renewals per process
(least of them), renewal failures, failed calls of each kind, restarts (none expected).

    .venv/bin/python bench/cert_renewal_bench.py [--ttl 600] [--duration 3600]
        [--acquire-every 30] [--tiny]

The hour the issue asks for: `--ttl 600 --duration 3600` (about 6 renewals per process).
Record it: `bench/run_all.py --record cert_renewal=<its JSON>`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import Report
from bench.scrape import metric
from tests.support.secure_box_env import openbao_identities, secure_box_up


async def drive(box: Any, duration: float, acquire_every: float, log: Any) -> dict[str, Any]:
    """Calls through every hop for `duration`; what happened."""
    import nats
    import psycopg

    from workers import cert_renewal
    from workers.client_security import nats_options, postgres_conninfo
    from workers.devbox.secure import OPERATOR_KIND
    from workers.devbox.services import ChildProcessService
    from workers.temporal_connect import connect
    from workflows.acquisition.models import AcquisitionInput, AcquisitionState, LaunchItem
    from workflows.acquisition.workflow import AcquisitionWorkflow

    profile = box.secure
    operator = profile.settings_for(OPERATOR_KIND, "r1")
    ports = {
        s.name: s.targets[0].port
        for s in box.services(workers=True)
        if isinstance(s, ChildProcessService) and s.targets
    }
    pids = {s.name: s.pid for s in box.status() if s.name in ports}

    own_dir = Path(tempfile.mkdtemp(prefix="sco-cert-bench-own-"))
    s = profile.settings_for("contract-sync", "r1")
    cert, key = own_dir / "tls.crt", own_dir / "tls.key"
    mine = s.model_copy(
        update={
            "identity": s.identity.model_copy(update={"cert_file": cert, "key_file": key}),
            "nats_tls": s.nats_tls.model_copy(
                update={"client_cert_file": cert, "client_key_file": key}
            ),
            "postgres": s.postgres.model_copy(update={"sslcert_file": cert, "sslkey_file": key}),
        }
    )
    renewer = cert_renewal.renewer(mine)
    assert renewer is not None
    await renewer.ensure_current()
    stop = asyncio.Event()
    renewing = asyncio.create_task(renewer.run(stop))

    async def quiet(_exc: Exception) -> None:
        pass

    nc = await nats.connect(
        mine.nats_url,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        error_cb=quiet,
        **nats_options(mine),
    )
    reconnects = 0
    pending_reconnect = asyncio.Event()

    async def after_renewal(_bundle: Any) -> None:
        pending_reconnect.set()

    renewer.add_hook(after_renewal)
    received: set[int] = set()

    async def on_msg(msg: Any) -> None:
        received.add(int(msg.data))

    subject = f"sco.r1.bench.renewal.{uuid.uuid4().hex[:6]}"
    await nc.subscribe(subject, cb=on_msg)
    client = await connect(operator, "r1")

    async def acquire() -> bool:
        contract = f"cb-{uuid.uuid4().hex[:6]}"
        item = LaunchItem(pool_id="r1.A.gp.l", hall="A", flavor="gp.l", instances=1, units=1)
        try:
            handle = await client.start_workflow(
                AcquisitionWorkflow.run,
                AcquisitionInput(region="r1", contract=contract, tier=2, items=[item]),
                id=f"acq-{contract}",
                task_queue=operator.temporal.task_queue("r1"),
            )
            result = await asyncio.wait_for(handle.result(), 120)
        except Exception as exc:  # a failed call is the figure
            log(f"acquisition {contract} failed: {exc!r}")
            return False
        return result.progress.state is AcquisitionState.COMPLETED

    acquisitions: list[asyncio.Task[bool]] = []
    published = db_ok = db_failed = 0
    started = time.monotonic()
    next_acquire = started
    next_log = started
    while time.monotonic() - started < duration:
        published += 1
        await nc.publish(subject, str(published).encode())
        try:
            with psycopg.connect(postgres_conninfo(mine), connect_timeout=5) as conn:
                conn.execute("SELECT 1").fetchone()
            db_ok += 1
        except psycopg.OperationalError as exc:
            db_failed += 1
            log(f"PostgreSQL connection failed: {exc}")
        if time.monotonic() >= next_acquire:
            acquisitions.append(asyncio.create_task(acquire()))
            next_acquire += acquire_every
        if pending_reconnect.is_set():
            pending_reconnect.clear()
            reconnects += 1
            # What was published is delivered first (core NATS drops what is in flight on
            # a connection cut under it); then the cut, with the renewed certificate to
            # come back with. What is published meanwhile waits in the client's buffer.
            await nc.flush(timeout=10)
            await nc.force_reconnect()
        if time.monotonic() >= next_log:
            next_log += 60
            renewed = {n: metric(p, "sco_certificate_renewals_total") for n, p in ports.items()}
            log(
                f"{time.monotonic() - started:.0f} s: published {published}, received "
                f"{len(received)}, db {db_ok}/{db_failed} failed, acquisitions "
                f"{len(acquisitions)}, renewals {renewed}, own {renewer.renewals}"
            )
        await asyncio.sleep(1)
    await nc.flush(timeout=10)
    await asyncio.sleep(1)
    outcomes = await asyncio.gather(*acquisitions)
    stop.set()
    await renewing
    await nc.close()
    renewals = {n: metric(p, "sco_certificate_renewals_total") for n, p in ports.items()}
    failures = {n: metric(p, "sco_certificate_renewal_failures_total") for n, p in ports.items()}
    after = {st.name: st.pid for st in box.status() if st.name in ports}
    shutil.rmtree(own_dir, ignore_errors=True)
    return {
        "renewals": renewals,
        "renewal_failures": failures,
        "own_renewals": renewer.renewals,
        "own_failures": renewer.failures,
        "nats_published": published,
        "nats_received": len(received),
        "nats_reconnects": reconnects,
        "db_ok": db_ok,
        "db_failed": db_failed,
        "acquisitions": len(outcomes),
        "acquisitions_failed": sum(1 for ok in outcomes if not ok),
        "restarts": sum(1 for n, pid in pids.items() if after.get(n) != pid),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ttl", type=int, default=600, help="certificate lifetime asked, seconds")
    ap.add_argument("--duration", type=float, default=3600, help="seconds of calls")
    ap.add_argument("--acquire-every", type=float, default=30.0)
    ap.add_argument("--tiny", action="store_true", help="--ttl 60 --duration 35")
    args = ap.parse_args()
    if args.tiny:
        args.ttl, args.duration, args.acquire_every = 60, 35, 10.0  # one renewal each
    report = Report(
        "cert_renewal",
        {"ttl_s": args.ttl, "duration_s": args.duration, "acquire_every_s": args.acquire_every},
    )

    def log(line: str) -> None:
        stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
        print(f"{stamp} {line}", file=sys.stderr, flush=True)

    from workers.devbox import tls_servers

    if tls_servers.postgres_bin_dir() is None or shutil.which("nginx") is None:
        report.measurement_missing(
            "renewals_per_process_min", "PostgreSQL server binaries or nginx missing", "renewals",
            anchor="the secure box",
        )  # fmt: skip
        return report.emit()
    steps: dict[str, float] = {}
    mark = time.monotonic()

    def on_step(name: str, msg: str) -> None:
        nonlocal mark
        now = time.monotonic()
        if not msg.startswith("starting"):
            steps[name] = steps.get(name, 0.0) + (now - mark)
        mark = now
        log(f"{name}: {msg}")

    t0 = time.monotonic()
    with secure_box_up(
        "cert-bench", with_workers=True, on_step=on_step, extra=openbao_identities(args.ttl)
    ) as (box, _):
        up_s = time.monotonic() - t0
        report.figure(
            "openbao_provision_s", steps.get("openbao"), "s",
            anchor="start, init, unseal and provision of a fresh box's OpenBao",
        )  # fmt: skip
        report.figure("box_up_s", up_s, "s", anchor="`sco dev up --profile secure`, all processes")
        got = asyncio.run(drive(box, args.duration, args.acquire_every, log))
    renewals = [v for v in got["renewals"].values() if v is not None]
    # OpenBao back-dates notBefore by 30 s: renewed (ttl + 30) * 2/3 - 30 s after issue.
    expected = int(args.duration // ((args.ttl + 30) * 2 / 3 - 30))
    if renewals and len(renewals) == len(got["renewals"]):
        report.figure(
            "renewals_per_process_min", min(renewals), "renewals",
            target=max(1, expected - 1), comparator=">=",
            anchor=f"each box process's sco_certificate_renewals_total (about {expected} due)",
        )  # fmt: skip
    else:
        report.measurement_missing(
            "renewals_per_process_min", f"a process's metrics did not answer: {got['renewals']}",
            "renewals", anchor="each box process's sco_certificate_renewals_total",
        )  # fmt: skip
    fails = sum(v or 0 for v in got["renewal_failures"].values()) + got["own_failures"]
    report.figure(
        "renewal_failures", fails, "renewals", target=0, comparator="==",
        anchor="sco_certificate_renewal_failures_total of every process and the bench's own",
    )  # fmt: skip
    report.figure(
        "failed_acquisitions", got["acquisitions_failed"], "calls", target=0, comparator="==",
        anchor=f"of {got['acquisitions']} through the worker on mTLS Temporal",
    )  # fmt: skip
    report.figure(
        "nats_messages_lost", got["nats_published"] - got["nats_received"], "messages",
        target=0, comparator="==",
        anchor=f"of {got['nats_published']}, through {got['nats_reconnects']} reconnects "
        "each after a renewal",
    )  # fmt: skip
    report.figure(
        "failed_db_connections", got["db_failed"], "connections", target=0, comparator="==",
        anchor=f"of {got['db_ok'] + got['db_failed']} new TLS connections with renewed files",
    )  # fmt: skip
    report.figure(
        "process_restarts", got["restarts"], "processes", target=0, comparator="==",
        anchor="box processes whose pid changed",
    )  # fmt: skip
    report.details = got
    return report.emit()


if __name__ == "__main__":
    sys.exit(main())
