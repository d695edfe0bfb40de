"""Kill the worker process in the middle of acquisitions, many times, on Temporal's real
dev server: every acquisition still completes, no instance is created twice and none is
leaked at the provider.

The worker is `python -m workers.cli worker` in its own process (SIGKILL: no graceful
anything); the simulated cloud serves over NATS from this process, so it outlives every
worker; fleet state is a scratch PostgreSQL database.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import nats
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities.events import InstanceState
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from activities.provider.sim_service import serve
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from tests.support import services
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO
from workers.temporal_bootstrap import bootstrap_namespace
from workflows.acquisition.models import AcquisitionInput, AcquisitionState, LaunchItem
from workflows.acquisition.workflow import AcquisitionWorkflow

ACQUISITIONS = 6
INSTANCES_EACH = 8
KILLS = 8


@pytest.fixture
def crash_db(region_r1: Region) -> Iterator[str]:
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    pool = open_pool(dsn, max_size=2)
    FleetRepository(pool).sync_pools(region_r1)
    pool.close()
    yield dsn
    services.drop_database(dsn)


@pytest.fixture
async def sim(region_r1: Region) -> AsyncIterator[tuple[SimulatedCloud, str]]:
    prefix = f"crash{uuid.uuid4().hex[:8]}"
    loop = asyncio.get_running_loop()
    # Boots take a while, so kills land while instances wait for ACTIVE too.
    cloud = SimulatedCloud(region_r1, latency=Latency(api_s=0.01, boot_s=0.8), clock=loop.time)
    nc = await nats.connect("nats://127.0.0.1:4222")
    task = asyncio.create_task(serve(cloud, nc, prefix=prefix))
    yield cloud, prefix
    task.cancel()
    await nc.close()


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "worker", "--region", "r1"],
        cwd=REPO,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


async def test_killing_the_worker_mid_acquisition_never_duplicates_or_leaks(
    dev_server_env: WorkflowEnvironment,
    crash_db: str,
    sim: tuple[SimulatedCloud, str],
    tmp_path: Path,
) -> None:
    cloud, prefix = sim
    ns_prefix = f"crash-{uuid.uuid4().hex[:6]}-"
    address = dev_server_env.client.service_client.config.target_host
    await bootstrap_namespace(dev_server_env.client, f"{ns_prefix}r1", timedelta(days=1))
    client = await Client.connect(
        address, namespace=f"{ns_prefix}r1", data_converter=pydantic_data_converter
    )
    env = {
        **os.environ,
        "SCO_TEMPORAL__ADDRESS": address,
        "SCO_TEMPORAL__NAMESPACE_PREFIX": ns_prefix,
        "SCO_POSTGRES_DSN": crash_db,
        "SCO_NATS_URL": "nats://127.0.0.1:4222",
        "SCO_PROVIDER__KIND": "simulator",
        "SCO_PROVIDER__SIMULATOR_PREFIX": prefix,
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_DATA_DIR": str(tmp_path / "data"),
        "SCO_LEDGER_DSN": "chdb://memory",
        "SCO_WORKER__METRICS_PORT": "0",
        "SCO_WORKER__HEALTH_PORT": "0",
        "SCO_WORKER__START_CONTROLLERS": "false",
        "SCO_WORKER__GRACEFUL_SHUTDOWN_SECONDS": "0",
        "SCO_CONTROL__BUDGET_RATE_PER_SECOND": "15",
        "SCO_CONTROL__BUDGET_BURST": "5",
    }
    log = tmp_path / "worker.log"
    pools = ["r1.A.gp.l", "r1.B.cpu.l", "r1.C.mem.l", "r1.D.gp.xl"]
    # A new namespace takes a moment to become usable on the dev server.
    for _ in range(100):
        try:
            await client.count_workflows()
            break
        except RPCError:
            await asyncio.sleep(0.1)
    handles = []
    for i in range(ACQUISITIONS):
        pool = pools[i % len(pools)]
        hall, sku, size = pool.split(".")[1:]
        inp = AcquisitionInput(
            region="r1",
            contract=f"crash-{i}",
            tier=2,
            items=[
                LaunchItem(
                    pool_id=pool,
                    hall=hall,
                    flavor=f"{sku}.{size}",
                    instances=INSTANCES_EACH,
                    units=INSTANCES_EACH,
                )
            ],
            max_parallel=4,
            poll_seconds=0.2,
        )
        handles.append(
            await client.start_workflow(
                AcquisitionWorkflow.run,
                inp,
                id=f"acq-r1-crash-{i}-{uuid.uuid4().hex[:6]}",
                task_queue="sco-r1",
            )
        )
    rng = random.Random(7)
    kills = 0
    worker = start_worker(env, log)
    try:
        for _ in range(KILLS):
            await asyncio.sleep(rng.uniform(1.5, 3.5))
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            kills += 1
            worker = start_worker(env, log)
        results = [await asyncio.wait_for(h.result(), timeout=150) for h in handles]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    assert kills == KILLS
    for r in results:
        assert r.progress.state is AcquisitionState.COMPLETED, r.progress
        assert r.progress.active == INSTANCES_EACH and r.progress.shortfall_units == 0
    owned = [i for i in await cloud.list_owned("r1") if i.name.startswith("acq-r1-crash-")]
    names = [i.name for i in owned]
    assert len(names) == len(set(names)), "an instance was created twice"
    assert len(owned) == ACQUISITIONS * INSTANCES_EACH
    db = open_pool(crash_db, max_size=1)
    try:
        rows = FleetRepository(db).list_instances("r1")
    finally:
        db.close()
    assert all(r.state is InstanceState.ACTIVE for r in rows)
    # Every provider instance is in fleet state with its provider id, and vice versa.
    assert {(r.instance_id, r.provider_id) for r in rows} == {
        (i.name, i.provider_id) for i in owned
    }
    assert cloud.calls["create"] >= len(owned)
