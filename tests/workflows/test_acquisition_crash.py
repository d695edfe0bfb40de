"""Kill the worker process in the middle of acquisitions, many times, on Temporal's real
dev server: every acquisition still completes, no instance is created twice and none is
leaked at the provider.

The worker is `python -m workers.cli worker` in its own process (SIGKILL: no graceful
anything); the simulated cloud serves over NATS from this process, so it outlives every
worker; fleet state is a scratch PostgreSQL database.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.events import InstanceState
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from tests.support import chaos
from tests.support.worker_kills import (
    KillableWorker,
    fleet_db,
    instance_counts,
    kill_repeatedly,
    region_namespace,
    served_cloud,
    sim_view,
    start_acquisitions,
    worker_env,
)
from workflows.acquisition.models import AcquisitionState

pytestmark = pytest.mark.chaos

ACQUISITIONS = 6
INSTANCES_EACH = 8
KILLS = 8


@pytest.fixture
def crash_db(region_r1: Region) -> Iterator[str]:
    with fleet_db(region_r1) as dsn:
        yield dsn


@pytest.fixture
async def sim(region_r1: Region) -> AsyncIterator[tuple[SimulatedCloud, str]]:
    # Boots take a while, so kills land while instances wait for ACTIVE too.
    async with served_cloud(region_r1, "crash", Latency(api_s=0.01, boot_s=0.8)) as served:
        yield served


async def test_killing_the_worker_mid_acquisition_never_duplicates_or_leaks(
    dev_server_env: WorkflowEnvironment,
    crash_db: str,
    sim: tuple[SimulatedCloud, str],
    tmp_path: Path,
) -> None:
    cloud, prefix = sim
    client, ns_prefix = await region_namespace(dev_server_env, "crash")
    address = client.service_client.config.target_host
    env = worker_env(
        address,
        ns_prefix,
        crash_db,
        tmp_path,
        SCO_PROVIDER__KIND="simulator",
        SCO_PROVIDER__SIMULATOR_PREFIX=prefix,
    )
    worker = KillableWorker(env, tmp_path / "worker.log")
    handles = await start_acquisitions(client, "crash", ACQUISITIONS, INSTANCES_EACH)
    worker.start()
    try:
        await kill_repeatedly(worker, KILLS, low=1.5, high=3.5)
        results = [await asyncio.wait_for(h.result(), timeout=150) for h in handles]
        alive = worker.alive()  # the last restart still running at the end
    finally:
        worker.stop()
    counts = chaos.report(
        "worker_sigkill_mid_acquisition",
        **instance_counts(await sim_view(cloud), crash_db, prefix="acq-r1-crash-"),
        workflows_failed_or_stuck=sum(
            1
            for r in results
            if r.progress.state is not AcquisitionState.COMPLETED
            or r.progress.active != INSTANCES_EACH
        ),
        processes_dead_after_recovery=int(not alive),
    )
    assert chaos.nonzero(counts) == {}
    assert worker.kills == KILLS
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
