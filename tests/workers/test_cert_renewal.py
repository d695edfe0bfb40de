"""Certificates from OpenBao renew without a restart (issue 30).

The secure box (`sco dev up --profile secure`) with its processes, every identity from the
box's real OpenBao at a 60 s lifetime (OpenBao back-dates notBefore by 30 s: 90 s in all,
renewed every ~60 s... at 2/3 of it). Over ~2 minutes:
- every box process renews at least twice (its own sco_certificate_renewals_total, no
  failure) and keeps its pid (no restart);
- acquisitions started across the renewals complete through the worker on mTLS Temporal
  (its client replaced after each renewal);
- in this test process, a NATS subscription made with a renewing identity keeps receiving
  through reconnects forced after its first certificate expired (the reloaded SSLContext
  presents the new certificate), while a client whose context was not reloaded cannot
  reconnect; new PostgreSQL connections keep answering with the renewed files.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import psycopg
import pytest
from nats.aio.msg import Msg

from contracts.cert_renewal import Renewer, read_validity
from tests.support.secure_box_env import need_servers, openbao_identities, secure_box_up
from tests.support.wait import WaitTimeout, checked, eventually, eventually_async
from workers import cert_renewal
from workers.client_security import nats_options, postgres_conninfo, ssl_context
from workers.devbox.box import Box
from workers.devbox.secure import OPERATOR_KIND, SecureProfile
from workers.devbox.services import ChildProcessService
from workers.settings import Settings
from workers.temporal_connect import connect
from workflows.acquisition.models import AcquisitionInput, AcquisitionState, LaunchItem
from workflows.acquisition.workflow import AcquisitionWorkflow

pytestmark = [pytest.mark.devbox, pytest.mark.timeout(240)]

TTL_S = 60


@dataclass(frozen=True)
class RenewingBox:
    box: Box
    profile: SecureProfile
    operator: Settings


@pytest.fixture(scope="module")
def renewing_box() -> Iterator[RenewingBox]:
    need_servers()
    with secure_box_up("renew-box", with_workers=True, extra=openbao_identities(TTL_S)) as (box, _):
        assert box.secure is not None
        operator = box.secure.settings_for(OPERATOR_KIND, "r1")
        yield RenewingBox(box, box.secure, operator)


def _metric(port: int, name: str) -> float:
    """The sum of a metric's series on a process's metrics port (-1: it did not answer)."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    except OSError:
        return -1.0
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _metrics(ports: dict[str, int], name: str) -> dict[str, float]:
    return {n: _metric(p, name) for n, p in ports.items()}


def _answered(scraped: dict[str, float]) -> dict[str, float] | None:
    """`scraped` when every process answered its scrape, else None (try again: a process
    slow to answer under load is not a failed renewal, which a -1 would have counted as)."""
    return scraped if all(v >= 0 for v in scraped.values()) else None


def _query(conninfo: str) -> None:
    with psycopg.connect(conninfo, connect_timeout=5) as conn:
        conn.execute("SELECT 1").fetchone()


def _processes(b: RenewingBox) -> dict[str, int]:
    """Each box process and its first metrics port."""
    return {
        s.name: s.targets[0].port
        for s in b.box.services(workers=True)
        if isinstance(s, ChildProcessService) and s.targets
    }


async def _acquire(b: RenewingBox, client: object) -> AcquisitionState:
    from temporalio.client import Client

    assert isinstance(client, Client)
    contract = f"ren-{uuid.uuid4().hex[:6]}"
    item = LaunchItem(pool_id="r1.A.gp.l", hall="A", flavor="gp.l", instances=1, units=1)
    handle = await client.start_workflow(
        AcquisitionWorkflow.run,
        AcquisitionInput(region="r1", contract=contract, tier=2, items=[item]),
        id=f"acq-{contract}",
        task_queue=b.operator.temporal.task_queue("r1"),
    )
    result = await asyncio.wait_for(handle.result(), 60)
    return result.progress.state


def _own_identity(b: RenewingBox, tmp: Path) -> Settings:
    """This test's identity (contract-sync: a kind the box runs no process of), renewing
    into files of its own."""
    s = b.profile.settings_for("contract-sync", "r1")
    cert, key = tmp / "tls.crt", tmp / "tls.key"
    tls = s.nats_tls.model_copy(update={"client_cert_file": cert, "client_key_file": key})
    return s.model_copy(
        update={
            "identity": s.identity.model_copy(update={"cert_file": cert, "key_file": key}),
            "nats_tls": tls,
            "postgres": s.postgres.model_copy(update={"sslcert_file": cert, "sslkey_file": key}),
        }
    )


# The timeout counts the module's box coming up (the first test to use it pays for it:
# OpenBao, the secure box and its workers, a minute or more on a busy machine) beside the
# scenario's own 150-s bound and the acquisitions it waits for: 240 s ran out once in a
# fresh-clone CI run whose suite took 26 min.
@pytest.mark.timeout(420)
def test_every_process_renews_twice_and_no_call_fails(
    renewing_box: RenewingBox, tmp_path: Path
) -> None:
    b = renewing_box
    ports = _processes(b)
    assert {"worker-r1", "sim-r1", "drain-intake-r1", "ledger-consumer"} <= set(ports), ports
    status = {s.name: s for s in b.box.status()}
    pids = {name: status[name].pid for name in ports}
    assert all(pids.values()), pids
    assert "cert openbao, not_after" in status["worker-r1"].detail, status["worker-r1"]

    mine = _own_identity(b, tmp_path)
    renewer = cert_renewal.renewer(mine)
    assert isinstance(renewer, Renewer)

    async def scenario() -> dict[str, object]:
        await renewer.ensure_current()
        first = read_validity(renewer.cert_path)
        assert first is not None
        key_pem = renewer.key_path.read_bytes()
        stop = asyncio.Event()
        renewing = asyncio.create_task(renewer.run(stop))
        opts = nats_options(mine)
        # A second client whose context is made here, outside the reloaded set.
        frozen = ssl.create_default_context(cafile=str(mine.nats_tls.ca_file))
        frozen.load_cert_chain(str(renewer.cert_path), str(renewer.key_path))
        assert opts["tls"] is not frozen

        async def quiet(_exc: Exception) -> None:
            pass

        nc = await nats.connect(
            mine.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
            error_cb=quiet, **opts,
        )  # fmt: skip
        stale = await nats.connect(
            mine.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.5, error_cb=quiet,
            **(opts | {"tls": frozen}),
        )  # fmt: skip
        received: list[int] = []

        async def on_msg(msg: Msg) -> None:
            received.append(int(msg.data))

        subject = f"sco.r1.test.renewal.{uuid.uuid4().hex[:6]}"
        await nc.subscribe(subject, cb=on_msg)
        operator = await connect(b.operator, "r1")
        acquisitions: list[asyncio.Task[AcquisitionState]] = []
        db_answers = db_failures = published = 0
        forced = False
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            published += 1
            await nc.publish(subject, str(published).encode())
            try:
                await asyncio.to_thread(_query, postgres_conninfo(mine))
                db_answers += 1
            except psycopg.OperationalError:
                db_failures += 1
            if published % 10 == 1:
                acquisitions.append(asyncio.create_task(_acquire(b, operator)))
            # Once the first certificate has expired: a network blip for both clients.
            if not forced and dt.datetime.now(dt.UTC) > first[1] + dt.timedelta(seconds=2):
                forced = True
                await nc.force_reconnect()
                await stale.force_reconnect()
            renewed = await asyncio.to_thread(_metrics, ports, "sco_certificate_renewals_total")
            if forced and renewer.renewals >= 2 and min(renewed.values()) >= 2:
                break
            # sleep is the behaviour under test: a call a second on every hop, across renewals
            await asyncio.sleep(1)
        flushed = True
        try:
            await nc.flush(timeout=10)
        except nats.errors.Error:
            flushed = False
        if flushed:
            await eventually_async(
                checked(lambda: len(set(received)) >= published or None),
                timeout=10,
                what="every message published delivered",
            )
        states = await asyncio.gather(*acquisitions)
        # Connected, or back within 15 s: under load a ping can time out and the client be
        # mid-reconnect at this instant (an under-load pass saw it), and a reconnect with the
        # reloaded context is what must succeed. The stale one never comes back (below).
        try:
            nc_connected: bool = await eventually_async(
                checked(lambda: nc.is_connected or None),
                timeout=15,
                what="the reloaded-context client connected",
            )
        except WaitTimeout:
            nc_connected = False  # reported with the rest below, not raised alone
        out: dict[str, object] = {
            "renewed": renewed,
            "failed": _metrics(ports, "sco_certificate_renewal_failures_total"),
            "flushed": flushed,
            "nc_error": repr(nc.last_error),
            "own_renewals": renewer.renewals,
            "own_failures": renewer.failures,
            "published": published,
            "received": len(set(received)),
            "nc_connected": nc_connected,
            "stale_connected": stale.is_connected,
            "db": (db_answers, db_failures),
            "states": states,
            "forced": forced,
            # Renewals keep the key (a CSR signed by the role): libpq, which opens the
            # certificate and the key apart, never pairs an old certificate with a new key.
            "key_kept": renewer.key_path.read_bytes() == key_pem,
        }
        stop.set()
        await renewing
        await nc.close()
        await stale.close()
        return out

    got = asyncio.run(scenario())
    logs = b.box.s.data_dir / "logs"
    tails = {
        n: (logs / f"{n}.log").read_text()[-1500:]
        for n, v in got["renewed"].items()  # type: ignore[attr-defined]
        if v < 2 and (logs / f"{n}.log").is_file()
    }
    assert not tails, tails
    renewed = got["renewed"]
    assert isinstance(renewed, dict)
    assert all(v >= 2 for v in renewed.values()), got
    failed = got["failed"]
    assert isinstance(failed, dict)
    if _answered(failed) is None:  # scraped again until every process answers
        failed = eventually(
            lambda: _answered(_metrics(ports, "sco_certificate_renewal_failures_total")),
            timeout=60,
            what="every process's renewal-failure count scraped",
        )
    # A failed renewal names itself in its process's log ("certificate renewal from ...
    # failed (why)"): those lines are the failure's message.
    why = {
        n: [x for x in (logs / f"{n}.log").read_text().splitlines() if "renewal" in x][-5:]
        for n, v in failed.items()
        if v and (logs / f"{n}.log").is_file()
    }
    assert not any(failed.values()), (why, got)
    assert got["own_renewals"] >= 2 and got["own_failures"] == 0, got  # type: ignore[operator]
    assert got["forced"] and got["key_kept"], got
    # Every message published arrived, through the reconnect made after the first
    # certificate expired: the reloaded context presented the renewed one.
    assert got["received"] == got["published"] and got["nc_connected"], got
    # The context made once and never reloaded cannot come back with its expired one.
    assert not got["stale_connected"], got
    assert got["db"][1] == 0, got  # type: ignore[index]
    states = got["states"]
    assert isinstance(states, list) and len(states) >= 2
    assert all(s is AcquisitionState.COMPLETED for s in states), got
    # No process restarted to pick its certificates up.
    now = {s.name: s.pid for s in b.box.status()}
    assert all(now[n] == pid for n, pid in pids.items()), (pids, now)


def test_the_box_writes_each_identity_where_the_box_ca_did(renewing_box: RenewingBox) -> None:
    """The secure box's file layout does not depend on the source: `pki/client-<region>-
    <kind>.crt|key`, 0600, now the OpenBao intermediate's; the trust bundle holds both."""
    pki = renewing_box.profile.root / "pki"
    worker = pki / "client-r1-worker.crt"
    from workers.devbox.bao_issuer import issuer_name

    assert issuer_name(worker) == "SCO r1 intermediate CA"
    assert (pki / "client-r1-worker.key").stat().st_mode & 0o777 == 0o600
    bundle = renewing_box.profile.issuer.ca_file
    assert bundle.name == "trust-bundle.crt"
    assert bundle.read_text().count("BEGIN CERTIFICATE") == 3  # box CA, root, r1
    # The operator's `sco` stays on the box CA: OpenBao has no role for it.
    assert issuer_name(pki / "client-r1-operator.crt") == "sco box CA"
    ctx = ssl_context(renewing_box.operator.nats_tls, "nats_tls")
    assert ctx is not None
