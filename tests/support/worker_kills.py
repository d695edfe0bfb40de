"""SIGKILL the region worker (`sco worker`, its own process) again and again while
workflows run, then count what the kills left behind. Shared by the chaos cases on the
simulated cloud and on the real test cloud: the cloud's own view of SCO's instances is a
callable given by the case (the simulator's state, or openstacksdk), never SCO's provider.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import nats
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities.events import TERMINAL_STATES
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from activities.provider.sim_service import serve
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.pool_id import PoolId
from contracts.region import Region
from tests.support import services
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO
from tests.support.wait import eventually_async
from tests.support.worker_nats import NATS_URL
from workers.temporal_bootstrap import bootstrap_namespace
from workflows.acquisition.models import AcquisitionInput, AcquisitionResult, LaunchItem
from workflows.acquisition.workflow import AcquisitionWorkflow


@contextmanager
def fleet_db(region: Region) -> Iterator[str]:
    """A scratch database of fleet state, migrated, holding `region`'s pools; dropped
    afterwards."""
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    pool = open_pool(dsn, max_size=2)
    FleetRepository(pool).sync_pools(region)
    pool.close()
    yield dsn
    services.drop_database(dsn)


@asynccontextmanager
async def served_cloud(
    region: Region, tag: str, latency: Latency
) -> AsyncIterator[tuple[SimulatedCloud, str]]:
    """The simulated cloud served over the machine's NATS from this process (so it outlives
    every worker), and its subject prefix (`tag` and a random suffix)."""
    prefix = f"{tag}{uuid.uuid4().hex[:8]}"
    loop = asyncio.get_running_loop()
    cloud = SimulatedCloud(region, latency=latency, clock=loop.time)
    nc = await nats.connect(NATS_URL)
    task = asyncio.create_task(serve(cloud, nc, prefix=prefix))
    yield cloud, prefix
    task.cancel()
    await nc.close()


async def sim_view(cloud: SimulatedCloud, region: str = "r1") -> CloudView:
    """SCO's instances as the simulator's own state holds them."""
    return CloudView([(i.name, i.provider_id) for i in await cloud.list_owned(region)])


@dataclass
class KillableWorker:
    """`sco worker --region r1` with `env`; every start appends to one log."""

    env: dict[str, str]
    log: Path
    kills: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "worker", "--region", "r1"],
            cwd=REPO,
            env=self.env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.kills += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, within: float = 30) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=within)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def kill_repeatedly(
    worker: KillableWorker, times: int, *, low: float, high: float, seed: int = 7
) -> None:
    """Kill and restart the worker `times` times, `low`..`high` seconds apart (seeded)."""
    rng = random.Random(seed)
    for _ in range(times):
        # sleep is the behaviour under test: the (seeded) pause between chaos kills
        await asyncio.sleep(rng.uniform(low, high))
        worker.kill()
        worker.start()


async def region_namespace(server: WorkflowEnvironment, tag: str) -> tuple[Client, str]:
    """A fresh `<prefix>r1` namespace of the dev server (usable), its client and prefix."""
    prefix = f"{tag}-{uuid.uuid4().hex[:6]}-"
    await bootstrap_namespace(server.client, f"{prefix}r1", timedelta(days=1))
    client = await Client.connect(
        server.client.service_client.config.target_host,
        namespace=f"{prefix}r1",
        data_converter=pydantic_data_converter,
    )
    # A new namespace takes a moment to become usable on the dev server.
    await eventually_async(
        lambda: _usable(client),
        timeout=60,
        what=f"namespace {prefix}r1 usable on the dev server",
        retrying=RPCError,
    )
    return client, prefix


async def _usable(client: Client) -> bool:
    await client.count_workflows()
    return True


#: r1's pools the acquisitions go round, one a hall.
POOLS = ["r1.A.gp.l", "r1.B.cpu.l", "r1.C.mem.l", "r1.D.gp.xl"]


async def start_acquisitions(
    client: Client, tag: str, count: int, each: int, *, max_parallel: int = 4
) -> list[WorkflowHandle[AcquisitionWorkflow, AcquisitionResult]]:
    """`count` acquisitions of `each` instances on the region worker's queue, round the
    pools of `POOLS`: contracts `<tag>-<i>`, workflow ids `acq-r1-<tag>-<i>-<random>`."""
    handles = []
    for i in range(count):
        pool = POOLS[i % len(POOLS)]
        pid = PoolId.parse(pool)
        inp = AcquisitionInput(
            region="r1",
            contract=f"{tag}-{i}",
            tier=2,
            items=[
                LaunchItem(
                    pool_id=pool, hall=pid.hall, flavor=pid.flavor, instances=each, units=each
                )
            ],
            max_parallel=max_parallel,
            poll_seconds=0.2,
        )
        handles.append(
            await client.start_workflow(
                AcquisitionWorkflow.run,
                inp,
                id=f"acq-r1-{tag}-{i}-{uuid.uuid4().hex[:6]}",
                task_queue="sco-r1",
            )
        )
    return handles


def worker_env(
    address: str, ns_prefix: str, dsn: str, tmp_path: Path, **extra: str
) -> dict[str, str]:
    """The region worker's settings: no controllers (the case starts its workflows), no
    graceful shutdown (a kill is a kill), a generous token budget."""
    return {
        **os.environ,
        "SCO_TEMPORAL__ADDRESS": address,
        "SCO_TEMPORAL__NAMESPACE_PREFIX": ns_prefix,
        "SCO_POSTGRES_DSN": dsn,
        "SCO_NATS_URL": NATS_URL,
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_DATA_DIR": str(tmp_path / "data"),
        "SCO_LEDGER_DSN": "chdb://memory",
        "SCO_WORKER__METRICS_PORT": "0",
        # 0: its default (9465) is one port for every xdist worker's region worker
        "SCO_WORKER__STATE_METRICS_PORT": "0",
        "SCO_WORKER__HEALTH_PORT": "0",
        "SCO_WORKER__START_CONTROLLERS": "false",
        "SCO_WORKER__GRACEFUL_SHUTDOWN_SECONDS": "0",
        "SCO_CONTROL__BUDGET_RATE_PER_SECOND": "15",
        "SCO_CONTROL__BUDGET_BURST": "5",
        **extra,
    }


@dataclass
class CloudView:
    """SCO's instances as the cloud itself reports them: (name, provider id) pairs."""

    instances: Sequence[tuple[str, str]]
    names: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.names = [name for name, _ in self.instances]


def instance_counts(
    cloud: CloudView, dsn: str, *, prefix: str, region: str = "r1"
) -> dict[str, int]:
    """Duplicates and leaks at the cloud, ghosts in fleet state, for instances whose name
    starts with `prefix`."""
    ours = [(n, p) for n, p in cloud.instances if n.startswith(prefix)]
    names = [n for n, _ in ours]
    db = open_pool(dsn, max_size=1)
    try:
        rows = [
            r
            for r in FleetRepository(db).list_instances(region)
            if r.instance_id.startswith(prefix)
        ]
    finally:
        db.close()
    live = {r.instance_id: r.provider_id for r in rows if r.state not in TERMINAL_STATES}
    at_cloud = dict(ours)
    return {
        "duplicate_instances": len(names) - len(set(names)),
        # At the cloud, and fleet state does not hold it as live (or under another id).
        "leaked_instances": sum(1 for n, p in at_cloud.items() if live.get(n) != p),
        # Live in fleet state, gone at the cloud.
        "ghost_instances": sum(1 for n in live if n not in at_cloud),
    }


async def results(
    handles: Sequence[WorkflowHandle[Any, Any]],
    done: Callable[[Any], bool],
    *,
    within: float,
) -> int:
    """How many workflows did not end as `done` says within `within` seconds (failed or
    stuck)."""

    async def one(h: WorkflowHandle[Any, Any]) -> bool:
        try:
            return done(await asyncio.wait_for(h.result(), timeout=within))
        except Exception:
            return False

    oks = await asyncio.gather(*(one(h) for h in handles))
    return sum(1 for ok in oks if not ok)
