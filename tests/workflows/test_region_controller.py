"""RegionControllerWorkflow on the time-skipping server against real PostgreSQL, the
signed example bundle and the in-process simulated cloud: demand in, acquisitions out,
idle capacity released, continue-as-new carrying its counters."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.control.models import partition_of
from activities.events import InstanceState
from activities.fleet.control_state import ControlRepository
from activities.fleet.repository import FleetRepository
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.node_labels import kubelet_join_args
from contracts.region import Region
from tests.support import histories
from tests.support.control_harness import (
    Harness,
    fleet_repositories,
    install_example_bundle,
    poll_until,
    region_worker,
    skip_past_next_tick,
    skip_time,
)
from workflows.controller.models import ControllerConfig, ControllerInput, DemandChanged
from workflows.controller.workflow import RegionControllerWorkflow

CONTRACT = "spark-etl"  # 4 vCPU / 16 GiB units on gp|mem x xl|2xl: 2 or 4 units per instance


@pytest.fixture
def fresh_fleet(region_r1: Region) -> Iterator[tuple[FleetRepository, ControlRepository]]:
    """A database of its own: the controller plans the example contracts' whole fleet."""
    with fleet_repositories(region_r1) as repos:
        yield repos


@pytest.fixture
async def harness(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    fresh_fleet: tuple[FleetRepository, ControlRepository],
    tmp_path: Path,
) -> AsyncIterator[Harness]:
    cache, trust = install_example_bundle(tmp_path)
    loop = asyncio.get_running_loop()
    cloud = SimulatedCloud(region_r1, latency=Latency(boot_s=0.0), clock=loop.time)
    async with region_worker(
        workflow_env.client, cloud, *fresh_fleet, bundle_dir=cache, trust_dir=trust
    ) as h:
        yield h


def covered(h: Harness, contract: str) -> int:
    """Instances of the contract that are ACTIVE (gp/mem xl: 2 units, 2xl: 4 units)."""
    rows = h.fleet.list_instances("r1", [InstanceState.ACTIVE])
    return sum(2 if r.size == "xl" else 4 for r in rows if r.workload == contract)


async def start_controller(h: Harness, **config: object) -> str:
    partition = partition_of(CONTRACT, 4)
    wid = f"controller-test-{uuid.uuid4().hex[:6]}"
    await h.client.start_workflow(
        RegionControllerWorkflow.run,
        ControllerInput(region="r1", partition=partition, config=ControllerConfig(**config)),
        id=wid,
        task_queue=h.queue,
    )
    return wid


async def test_demand_becomes_acquisitions_and_idle_capacity_is_released(
    harness: Harness, workflow_env: WorkflowEnvironment
) -> None:
    harness.control.set_demand("r1", "cli", {CONTRACT: 40})
    wid = await start_controller(
        harness, release_idle_seconds=300, kubernetes_user_data="join: {kubelet_args}"
    )
    handle = harness.client.get_workflow_handle(wid)

    async def enough() -> bool:
        return covered(harness, CONTRACT) >= 40

    await poll_until(enough)
    # spark-etl has Kubernetes selectors: its nodes join labelled with pool, hall and
    # capacity type, and tainted as reclaimable (the names the Kyverno policy checks).
    for inst in await harness.cloud.list_owned("r1"):
        if inst.metadata.get("sco-workload") == CONTRACT:
            assert harness.cloud.user_data[inst.name] == "join: " + " ".join(
                kubelet_join_args(inst.pool_id, inst.hall, "reclaimable")
            )
    status = await handle.query(RegionControllerWorkflow.status)
    assert status.acquisitions_started >= 1 and status.last is not None
    assert status.last.demand_units == 40 and not status.last.problem
    # Spread: the example's spread group keeps no more than 25% of its units in one pool,
    # and the pool share cap holds.
    rows = [
        r
        for r in harness.fleet.list_instances("r1", [InstanceState.ACTIVE])
        if r.workload == CONTRACT
    ]
    per_pool: dict[str, int] = {}
    for r in rows:
        per_pool[r.pool_id] = per_pool.get(r.pool_id, 0) + (2 if r.size == "xl" else 4)
    assert max(per_pool.values()) <= 10

    # A tick without a change starts nothing new.
    started = status.acquisitions_started
    await skip_time(workflow_env, 130)
    assert (await handle.query(RegionControllerWorkflow.status)).acquisitions_started == started

    # Demand gone: surplus now, released once idle for 300 s.
    await skip_past_next_tick(workflow_env, handle)  # the signal meets no timer falling due
    harness.control.set_demand("r1", "cli", {CONTRACT: 0})
    await handle.signal(
        RegionControllerWorkflow.demand_changed, DemandChanged(contracts=[CONTRACT])
    )
    await skip_time(workflow_env, 420)

    async def released() -> bool:
        await skip_time(workflow_env, 60)
        return covered(harness, CONTRACT) == 0

    await poll_until(released)
    status = await handle.query(RegionControllerWorkflow.status)
    await histories.record(handle, "region_controller")
    assert status.released == len(rows)
    assert not [
        i
        for i in await harness.cloud.list_owned("r1")
        if i.metadata.get("sco-workload") == CONTRACT
    ]
    await handle.terminate()


async def test_continue_as_new_carries_the_counters(
    harness: Harness, workflow_env: WorkflowEnvironment
) -> None:
    harness.control.set_demand("r1", "cli", {CONTRACT: 8})
    wid = await start_controller(harness, ticks_per_run=2, tick_seconds=30)
    handle = harness.client.get_workflow_handle(wid)
    first = (await handle.describe()).run_id

    async def moved_on() -> bool:
        await skip_time(workflow_env, 30)
        desc = await handle.describe()
        return desc.run_id != first

    await poll_until(moved_on)
    status = await handle.query(RegionControllerWorkflow.status)
    assert status.ticks >= 2 and status.acquisitions_started >= 1
    await handle.terminate()


async def test_no_bundle_is_a_visible_problem_not_a_failure(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    fresh_fleet: tuple[FleetRepository, ControlRepository],
    tmp_path: Path,
) -> None:
    loop = asyncio.get_running_loop()
    cloud = SimulatedCloud(region_r1, clock=loop.time)
    (tmp_path / "trust").mkdir()
    async with region_worker(
        workflow_env.client,
        cloud,
        *fresh_fleet,
        bundle_dir=tmp_path / "cache",
        trust_dir=tmp_path / "trust",
    ) as h:
        wid = await start_controller(h)
        handle = h.client.get_workflow_handle(wid)

        async def ticked() -> bool:
            st = await handle.query(RegionControllerWorkflow.status)
            return st.last is not None

        await poll_until(ticked)
        st = await handle.query(RegionControllerWorkflow.status)
        assert st.last is not None and "no valid contract bundle" in st.last.problem
        await handle.terminate()
