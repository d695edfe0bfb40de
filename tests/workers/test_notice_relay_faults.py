"""The notice relay process outlives its dependencies: a fleet-database outage (the
database refusing and dropping connections) and an unreachable Temporal. Chaos cases:
each prints its counts as JSON (tests/support/chaos.py), all zero."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from activities.events import CapacityType, EventKind
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository, InstanceSpec
from activities.provider.interface import CreateRequest
from activities.provider.sim_service import SimulatorClient
from contracts.notice import (
    ReclaimNotice,
    hall_notice_subjects,
    reclaim_subject,
)
from contracts.reclaim import ReclaimReply, ReclaimRequest
from contracts.region import Region
from tests.support import chaos, services
from tests.support.nats_sync import server_has_seen
from tests.support.paths import REPO
from tests.support.sco_process import Process
from tests.support.wait import checked, eventually_async
from tests.support.worker_nats import NATS_URL

pytestmark = pytest.mark.chaos

POOL = "r1.A.cpu.l"


async def launch(env: dict[str, str], region: Region, count: int) -> list[str]:
    """`count` instances of POOL, created on the simulated cloud and active in fleet state."""
    sim = SimulatorClient(env["SCO_NATS_URL"], "r1", prefix=env["SCO_PROVIDER__SIMULATOR_PREFIX"])
    pool = open_pool(env["SCO_POSTGRES_DSN"], max_size=1)
    repo = FleetRepository(pool)
    names = []
    try:
        for _ in range(count):
            name = f"sco-r1-{uuid.uuid4().hex[:10]}"
            p = region.pool(POOL)
            inst = await sim.create(
                CreateRequest(name=name, region="r1", pool_id=POOL, hall=p.hall, flavor=p.flavor)
            )
            repo.record_acquire(
                InstanceSpec(
                    instance_id=name,
                    region="r1",
                    pool_id=POOL,
                    capacity_type=CapacityType.RECLAIMABLE,
                    workload="ci-runners",
                    tier=3,
                )
            )
            repo.record_event(name, EventKind.READY, provider_id=inst.provider_id)
            names.append(name)
    finally:
        pool.close()
        await sim.close()
    return names


class NoticeWatch:
    """Every notice of hall A as a node would receive it."""

    def __init__(self) -> None:
        self.received: list[ReclaimNotice] = []

    async def __aenter__(self) -> NoticeWatch:
        self._nc = await nats.connect(NATS_URL)

        async def collect(msg: Msg) -> None:
            # A signed envelope {key_id, notice, signature}: the notice is inside.
            self.received.append(ReclaimNotice.from_json(json.loads(msg.data)["notice"]))

        await self._nc.subscribe(hall_notice_subjects("r1", "A"), cb=collect)
        await server_has_seen(self._nc)  # the relay publishes on its own connection
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._nc.close()

    async def until(self, nodes: set[str], within: float) -> float:
        """Seconds until every node in `nodes` got a notice (fails past `within` seconds)."""
        started = time.monotonic()
        await eventually_async(
            checked(lambda: nodes <= {n.node for n in self.received}),
            timeout=within,
            what=f"notices for {sorted(nodes)}",
            every=0.05,
        )
        return time.monotonic() - started

    def counts(self, nodes: set[str]) -> dict[str, int]:
        ids: dict[str, set[str]] = {}
        for n in self.received:
            if n.node in nodes:
                ids.setdefault(n.node, set()).add(n.notice_id)
        return {
            "lost_notices": len(nodes - ids.keys()),
            # A node's notices all carry one stable id; a second id would be a second reclaim.
            "conflicting_notice_ids": sum(len(v) - 1 for v in ids.values()),
        }


async def http_get(port: int, path: str) -> tuple[int, str]:
    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(get)


def start_relay(env: dict[str, str], tmp_path: Path, processes: list[Process]) -> Process:
    sim = Process(env, tmp_path / "sim.log", "sim", "serve", "--region", "r1")
    processes.append(sim)
    sim.wait_for("simulated cloud for r1 on NATS")
    relay = Process(env, tmp_path / "relay.log", "notice-relay", "--region", "r1", "--hall", "A")
    processes.append(relay)
    relay.wait_for("notice relay r1/A: republished 0")
    return relay


async def test_notice_relay_outlives_a_fleet_database_outage(
    env: dict[str, str], region_r1: Region, tmp_path: Path, processes: list[Process]
) -> None:
    # A short pool wait so a few seconds of outage are several PoolTimeouts.
    health, metrics = services.free_port(), services.free_port()
    env = {
        **env,
        "SCO_FLEET_DB__POOL_TIMEOUT_SECONDS": "2",
        "SCO_NOTICE_RELAY__MAX_BACKOFF_SECONDS": "2",
        "SCO_NOTICE_RELAY__HEALTH_PORT": str(health),
        "SCO_NOTICE_RELAY__METRICS_PORT": str(metrics),
    }
    relay = start_relay(env, tmp_path, processes)
    assert await http_get(health, "/readyz") == (200, "ready\n")
    nodes = set(await launch(env, region_r1, 3))
    outage = chaos.DatabaseOutage(env["SCO_POSTGRES_DSN"])
    async with NoticeWatch() as watch:
        outage.begin()
        try:
            relay.wait_for("degraded (PoolTimeout", timeout=20)
            # Asked while degraded, the relay answers at once that it noticed nothing.
            started = time.monotonic()
            nc = await nats.connect(env["SCO_NATS_URL"])
            try:
                request = ReclaimRequest(pool_id=POOL, reason="chaos", requested_by="test")
                reply = await nc.request(
                    reclaim_subject("r1", "A"), request.model_dump_json().encode(), timeout=10
                )
            finally:
                await nc.close()
            answer = ReclaimReply.model_validate_json(reply.data)
            assert answer.error and "degraded, nothing noticed" in answer.error, answer
            assert time.monotonic() - started < 12
            # `sco reclaim` reads fleet state first (committed instances are refused): with
            # the database down it says so in one line, before asking the relay.
            code, out = await services.run_sco(env, "reclaim", "--pool", POOL, cwd=REPO)
            assert code == 1 and "PostgreSQL at" in out and "does not answer" in out, out
            # sleep is the behaviour under test: more failed sweeps, backoff at its cap
            await asyncio.sleep(4)
            assert (await http_get(health, "/readyz"))[0] == 503
            _, exposed = await http_get(metrics, "/metrics")
            assert 'sco_notice_relay_degraded{hall="A",region="r1"} 1.0' in exposed
        finally:
            outage.end()
        relay.wait_for("dependencies back", timeout=20)
        assert await http_get(health, "/readyz") == (200, "ready\n")
        code, out = await services.run_sco(env, "reclaim", "--pool", POOL, cwd=REPO)
        # The simulated cloud may have reclaimed some itself (its bursts): noticed either way.
        assert code == 0 and " noticed: " in out, out
        await watch.until(nodes, within=10)
        counts = chaos.report(
            "notice_relay_fleet_db_outage",
            **watch.counts(nodes),
            processes_dead_after_recovery=int(relay.proc.poll() is not None),
            unhandled_errors=relay.output().count("Traceback"),
        )
    assert chaos.nonzero(counts) == {}, relay.output()


async def test_notices_go_out_within_seconds_while_temporal_is_unreachable(
    env: dict[str, str], region_r1: Region, tmp_path: Path, processes: list[Process]
) -> None:
    # Nothing listens on this port. The relay never calls Temporal (decision 0030): the
    # notices wait in the stream for the region worker, and none runs here.
    env = {**env, "SCO_TEMPORAL__ADDRESS": f"127.0.0.1:{services.free_port()}"}
    relay = start_relay(env, tmp_path, processes)
    nodes = set(await launch(env, region_r1, 12))
    async with NoticeWatch() as watch:
        started = time.monotonic()
        code, out = await services.run_sco(env, "reclaim", "--pool", POOL, cwd=REPO)
        answered = time.monotonic() - started
        # The simulated cloud may have reclaimed some itself (its bursts): noticed either way.
        assert code == 0 and " noticed: " in out, out
        assert "exclusion cycle:" in out  # the CLI says the notices still to tell it
        all_out = await watch.until(nodes, within=10)
        print(f"sco reclaim answered in {answered:.2f} s; all notices {all_out:.2f} s later")
        counts = chaos.report(
            "notice_relay_temporal_unreachable",
            **watch.counts(nodes),
            processes_dead_after_recovery=int(relay.proc.poll() is not None),
            unhandled_errors=relay.output().count("Traceback"),
            # The CLI process starts Python (~2 s here); the relay's own part is the rest.
            slow_answer=int(answered > 8),
            slow_notices=int(all_out > 5),
        )
    assert chaos.nonzero(counts) == {}, relay.output()
