"""Headroom: the controller targets demand + headroom units, holds that cover as ready
instances (never released as surplus), meets a burst with them (no boot for the burst),
then refills; committed fallback is never bought for headroom.

The first cases are reconcile tables (pure); the last runs RegionControllerWorkflow on the
time-skipping server against real PostgreSQL, a signed bundle whose spark-etl carries
`headroom_units: 8` and the in-process simulated cloud.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.control.models import InstanceBrief, partition_of
from activities.events import CapacityType, InstanceState
from activities.fleet.control_state import ControlRepository
from activities.fleet.repository import FleetRepository
from activities.provider.simulator import Latency, SimulatedCloud
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
from tests.workflows.test_controller_reconcile import A_L, CFG, NOW, POOLS, pool, snapshot, view
from workflows.controller.models import ControllerConfig, ControllerInput, DemandChanged
from workflows.controller.reconcile import ReconcileResult, reconcile
from workflows.controller.workflow import RegionControllerWorkflow

# --- reconcile: demand + headroom (an `l` instance holds 2 units) --------------------------


def launched(out: ReconcileResult) -> int:
    return sum(i.instances for r in out.acquisitions for i in r.items)


@pytest.mark.parametrize(
    ("demand", "headroom", "held", "flag", "instances", "surplus"),
    [
        (10, 4, 0, True, 7, 0),  # demand 10 + headroom 4 = 14 units: 7 instances
        (10, 4, 0, False, 5, 0),  # before the patch: demand alone
        (10, 4, 7, True, 0, 0),  # headroom held: nothing to launch, nothing surplus
        (10, 4, 7, False, 0, 2),  # without headroom the cover is surplus (4 units)
        (14, 4, 7, True, 2, 0),  # a burst of 4 lands on the cover; 2 more refill it
        (0, 4, 0, True, 2, 0),  # no demand: the headroom alone is held
    ],
)
def test_the_target_is_demand_plus_headroom(
    demand: int, headroom: int, held: int, flag: bool, instances: int, surplus: int
) -> None:
    briefs = [
        InstanceBrief(
            instance_id=f"i{n}",
            pool_id=A_L,
            hall="A",
            state=InstanceState.ACTIVE,
            capacity_type=CapacityType.RECLAIMABLE,
            price_per_hour=1.0,
            provider_id=f"p{n}",
        )
        for n in range(held)
    ]
    snap = snapshot(
        view(
            units=demand,
            headroom_units=headroom,
            existing={A_L: held} if held else {},
            instances=briefs,
        )
    )
    out = reconcile(snap, CFG, NOW, headroom=flag)
    assert launched(out) == instances
    assert len(out.surplus) == surplus
    assert out.headroom_units == (headroom if flag else 0)
    assert out.shortfall_units == 0 and out.headroom_short_units == 0
    assert out.demand_units == demand


def test_fallback_is_bought_for_demand_never_for_headroom() -> None:
    no_room = [pool(p.pool_id, price=p.price_per_hour, free=0) for p in POOLS]
    snap = snapshot(view(units=10, headroom_units=4)).model_copy(update={"pools": no_room})
    out = reconcile(snap, CFG, NOW, headroom=True)
    assert (out.shortfall_units, out.headroom_short_units) == (10, 4)
    (req,) = out.acquisitions
    assert req.fallback is not None and req.fallback.shortfall_units == 10
    # Demand fully covered, only headroom short: no fallback at all.
    snap = snapshot(view(units=10, headroom_units=4, existing={A_L: 5})).model_copy(
        update={"pools": no_room}
    )
    out = reconcile(snap, CFG, NOW, headroom=True)
    assert (out.shortfall_units, out.headroom_short_units, out.acquisitions) == (0, 4, [])


# --- the controller on the time-skipping server ----------------------------------------------

CONTRACT = "spark-etl"  # 4 vCPU / 16 GiB units on gp|mem x xl|2xl: 2 or 4 units per instance
HEADROOM = 8


@pytest.fixture
def fresh_fleet(region_r1: Region) -> Iterator[tuple[FleetRepository, ControlRepository]]:
    with fleet_repositories(region_r1) as repos:
        yield repos


@pytest.fixture
async def harness(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    fresh_fleet: tuple[FleetRepository, ControlRepository],
    tmp_path: Path,
) -> AsyncIterator[Harness]:
    cache, trust = install_example_bundle(tmp_path, {CONTRACT: {"headroom_units": HEADROOM}})
    cloud = SimulatedCloud(
        region_r1, latency=Latency(boot_s=0.0), clock=asyncio.get_running_loop().time
    )
    async with region_worker(
        workflow_env.client, cloud, *fresh_fleet, bundle_dir=cache, trust_dir=trust
    ) as h:
        yield h


def units_of(h: Harness) -> dict[str, int]:
    """ACTIVE instances of the contract and the units each carries (xl: 2, 2xl: 4)."""
    rows = h.fleet.list_instances("r1", [InstanceState.ACTIVE])
    return {r.instance_id: 2 if r.size == "xl" else 4 for r in rows if r.workload == CONTRACT}


async def test_a_burst_lands_on_the_headroom_then_it_is_refilled(
    harness: Harness, workflow_env: WorkflowEnvironment
) -> None:
    harness.control.set_demand("r1", "cli", {CONTRACT: 8})
    wid = f"controller-headroom-{uuid.uuid4().hex[:6]}"
    await harness.client.start_workflow(
        RegionControllerWorkflow.run,
        ControllerInput(
            region="r1",
            partition=partition_of(CONTRACT, 4),
            config=ControllerConfig(release_idle_seconds=300),
        ),
        id=wid,
        task_queue=harness.queue,
    )
    handle = harness.client.get_workflow_handle(wid)

    async def held(units: int) -> bool:
        return sum(units_of(harness).values()) >= units

    # Demand 8 + headroom 8: 16 units held ready.
    await poll_until(lambda: held(16), what="demand + headroom held")
    status = await handle.query(RegionControllerWorkflow.status)
    assert status.last is not None and status.last.headroom_units == HEADROOM

    # Quiet for longer than the idle limit: the cover is not surplus, nothing is released.
    await skip_time(workflow_env, 420)
    await skip_past_next_tick(workflow_env, handle)  # the burst's signal meets no timer due
    status = await handle.query(RegionControllerWorkflow.status)
    assert status.released == 0 and status.last is not None and status.last.surplus == 0
    before = units_of(harness)
    assert sum(before.values()) >= 16
    started = status.acquisitions_started
    ticks = status.ticks

    # A burst of 8 (the headroom): covered at once by instances already up, then refilled.
    harness.control.set_demand("r1", "cli", {CONTRACT: 16})
    await handle.signal(
        RegionControllerWorkflow.demand_changed, DemandChanged(contracts=[CONTRACT])
    )

    async def burst_tick() -> bool:
        st = await handle.query(RegionControllerWorkflow.status)
        # The tick's summary fills in as it goes: wait for its refill to start.
        return (
            st.ticks > ticks
            and st.last is not None
            and st.last.demand_units == 16
            and st.acquisitions_started > started
        )

    await poll_until(burst_tick, what="the burst's tick")
    status = await handle.query(RegionControllerWorkflow.status)
    last = status.last
    assert last is not None
    # The burst's demand is held by the instances that were up before it (no boot for it):
    # the only launches are the refill of the headroom, 8 units.
    assert last.held_units >= 16 and last.shortfall_units == 0
    assert last.planned_units == HEADROOM and last.headroom_short_units == 0
    await poll_until(lambda: held(24), what="the headroom refilled")
    after = units_of(harness)
    assert set(before) <= set(after)  # nothing replaced: the burst ran on the cover
    assert sum(after[i] for i in set(after) - set(before)) >= HEADROOM
    await histories.record(handle, "region_controller_headroom")
    await handle.terminate()
