"""LifecycleWorkflow on the real OpenStack test cloud: the box tests' scenarios
(test_lifecycle_workflow.py, same harness: tests/support/lifecycle.py) with
`OpenStackProvider` (Nova, Placement, Blazar) in place of the simulator, the halls' notice
relays answering drain requests over real NATS, on the time-skipping server (a drain's
notice lead is skipped, a boot on Nova is real):

- a committed fallback instance, booted into a Blazar lease by a real fallback
  acquisition, replaced by a reclaimable one once the lifecycle has seen free capacity on
  two rounds: the replacement ACTIVE on the hall's spot host first, then the drain told,
  then the fallback deleted on Nova and its Blazar lease deleted;
- two half-empty mem.xl consolidated into one gp.2xl within a budget of 1: one drain at a
  time, both deleted on Nova;
- a contract change (mem no longer allowed) drifting an instance and replacing it;
- a blackout holding that drift while llm-train's floor keeper, on Blazar, rebuilds a
  lost hall's share in the other halls (never voluntary, never blocked).

Each test starts from its own fleet database and leaves the cloud as it found it. Needs
the test cloud (`make testcloud-up`); skips without it (fails with SCO_REQUIRE_TESTCLOUD=1).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import pytest
from temporalio.client import WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities.events import InstanceState
from activities.fleet.control_state import ControlRepository
from activities.floor.models import floor_workflow_id
from activities.lifecycle.models import lifecycle_workflow_id
from activities.provider.leases import fallback_acquisition, parse_lease_name
from activities.provider.openstack import OpenStackProvider
from contracts.region import Region
from planning.arbiter import FallbackItem, FallbackPlan
from tests.support import services
from tests.support.control_harness import poll_until, provider_worker, scratch_fleet, skip_time
from tests.support.lifecycle import (
    BUDGET_OF_ONE,
    CONTRACT,
    Life,
    assert_one_at_a_time,
    decisions,
    install_bundle,
    lifecycle_worker_kwargs,
    live,
    relays_heard,
    start,
    until_held,
    until_replaced,
)
from tests.support.testcloud import (
    floor_on_cloud,
    leave_as_found,
    provider_or_skip,
    sco_leases,
    sco_servers,
)
from tests.support.wait import eventually_async
from tests.support.worker_nats import NATS_URL
from workflows.acquisition.models import AcquisitionInput, AcquisitionState, LaunchItem
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.floor.models import FloorConfig, FloorInput, FloorState, HallEvent
from workflows.floor.workflow import FloorKeeperWorkflow
from workflows.lifecycle.workflow import LifecycleWorkflow

pytestmark = [
    pytest.mark.testcloud,
    pytest.mark.filterwarnings("ignore::openstack.warnings.RemovedInSDK50Warning"),
    pytest.mark.filterwarnings("ignore::openstack.warnings.RemovedInSDK60Warning"),
    pytest.mark.timeout(300),
]

#: The lifecycle on the cloud: rounds a minute apart in workflow time, no minimum age, and
#: a build timeout no skip of workflow time outruns while Nova boots for real.
CONFIG: dict[str, Any] = {"build_timeout_seconds": 3600, "poll_seconds": 1}
FLOOR = "llm-train"  # tier 1: gpu-a, halls A-D; a gpu-a.l holds one unit


@dataclass
class Tc(Life):
    provider: OpenStackProvider

    @property
    def conn(self) -> Any:
        return self.provider.connection


@pytest.fixture(scope="module")
async def workflow_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await services.start_workflow_env()
    yield env
    await env.shutdown()


@pytest.fixture
async def tc(
    workflow_env: WorkflowEnvironment, region_r1: Region, tmp_path: Path
) -> AsyncIterator[Tc]:
    provider = provider_or_skip()
    conn = provider.connection
    servers_before = set(await asyncio.to_thread(sco_servers, conn))
    leases_before = {x["id"] for x in await asyncio.to_thread(sco_leases, conn)}
    install_bundle(tmp_path, BUDGET_OF_ONE)
    client = workflow_env.client
    with scratch_fleet(region_r1) as (_, pool, fleet):
        nc = await nats.connect(NATS_URL)
        try:
            notices, leaving = await relays_heard(nc, fleet, provider)
            async with provider_worker(
                client,
                provider,
                fleet,
                ControlRepository(pool),
                **lifecycle_worker_kwargs(fleet, pool, provider, tmp_path),
            ) as queue:
                try:
                    yield Tc(
                        client=client,
                        queue=queue,
                        fleet=fleet,
                        pool=pool,
                        base=tmp_path,
                        notices=notices,
                        leaving_at_notice=leaving,
                        provider=provider,
                    )
                finally:
                    with contextlib.suppress(RPCError):
                        await client.get_workflow_handle(lifecycle_workflow_id("r1")).terminate()
        finally:
            await nc.close()
            await leave_as_found(provider, servers_before, leases_before)


async def acquire(tc: Tc, inp: AcquisitionInput) -> list[str]:
    """Spark-etl's instances as the controller acquires them (workflow id `acq-...`, so the
    lifecycle may replace them): every one ACTIVE on Nova."""
    handle = await tc.client.start_workflow(
        AcquisitionWorkflow.run,
        inp,
        id=f"acq-r1-{CONTRACT}-{uuid.uuid4().hex[:6]}",
        task_queue=tc.queue,
    )
    result = await handle.result()
    p = result.progress
    wanted = sum(i.instances for i in inp.items) or sum(
        i.instances for i in (inp.fallback.items if inp.fallback else [])
    )
    assert (p.state, p.active) == (AcquisitionState.COMPLETED, wanted), p
    return list(result.instance_ids)


def launch(pool_id: str, instances: int, units: int) -> AcquisitionInput:
    hall, flavor = pool_id.split(".", 2)[1], pool_id.split(".", 2)[2]
    item = LaunchItem(pool_id=pool_id, hall=hall, flavor=flavor, instances=instances, units=units)
    return AcquisitionInput(region="r1", contract=CONTRACT, tier=2, items=[item])


def server_of(tc: Tc, instance_id: str) -> str:
    row = tc.fleet.get_instance(instance_id)
    assert row is not None and row.provider_id is not None, row
    return row.provider_id


async def servers(tc: Tc) -> dict[str, Any]:
    return await asyncio.to_thread(sco_servers, tc.conn)


async def until_gone_on_nova(tc: Tc, provider_ids: list[str]) -> None:
    """Nova deletes asynchronously: the servers disappear from its list a moment later."""

    async def gone() -> bool:
        return not set(provider_ids) & set(await servers(tc))

    await eventually_async(gone, timeout=60, what=f"{provider_ids} gone from Nova", every=1)


async def until_replaced_on_cloud(tc: Tc, workflow_env: WorkflowEnvironment, n: int) -> None:
    # 10 s of workflow time a second: the notice lead (120 s) passes in ~12 s, and a boot
    # (real time) never meets its build timeout.
    await until_replaced(tc, workflow_env, n, within=200, skip=10, every=1)


async def test_a_blazar_fallback_returns_to_reclaimable_capacity_on_nova(
    tc: Tc, workflow_env: WorkflowEnvironment
) -> None:
    plan = FallbackPlan(
        contract=CONTRACT,
        shortfall_units=2,
        items=[
            FallbackItem(
                pool_id="r1.A.gp.xl",
                hall="A",
                flavor="gp.xl",
                instances=1,
                units=2,
                price_per_hour=0.176,
            )
        ],
        cost_per_hour=0.176,
        current_spend_per_hour=0.0,
        authority_per_hour=10.0,
        needs_approval=False,
        reason="no reclaimable capacity (test)",
    )
    (fb,) = await acquire(
        tc, AcquisitionInput(region="r1", contract=CONTRACT, tier=2, fallback=plan)
    )
    fb_server = server_of(tc, fb)
    acq = (tc.fleet.get_instance(fb) or pytest.fail(fb)).acquisition_id or ""
    fallback_leases = len(await leases_of(tc, acq))
    before = (await servers(tc))[fb_server]
    assert before.status == "ACTIVE" and before.compute_host == "hall-a-committed"  # Blazar's
    assert before.metadata["sco-capacity"] == "committed"
    assert [t for _, _, t, _ in live(tc)] == ["committed"]

    handle = await start(tc, **CONFIG)
    await until_replaced_on_cloud(tc, workflow_env, 1)

    ((new, pool_id, kind, acq),) = live(tc)
    assert kind == "reclaimable" and acq.startswith(f"life-r1-{CONTRACT}-")
    on_nova = (await servers(tc))[server_of(tc, new)]
    hall = pool_id.split(".")[1]
    assert on_nova.status == "ACTIVE" and on_nova.compute_host == f"hall-{hall.lower()}"
    assert on_nova.metadata["sco-capacity"] == "reclaimable"
    await until_gone_on_nova(tc, [fb_server])
    row = tc.fleet.get_instance(fb)
    assert row is not None and row.state is InstanceState.DELETED
    # Make-before-break: the drain was told once, after the replacement was ACTIVE.
    assert [n.node for n in tc.notices] == [fb] and tc.leaving_at_notice == [1]
    disruption = decisions(tc, "disruption")
    assert any("seen on 1 of 2 rounds" in r for _, o, r in disruption if o == "held")
    outcomes = [(s, o) for s, o, _ in disruption]
    assert outcomes.index((fb, "replacing")) < outcomes.index((fb, "replaced"))
    st = await handle.query(LifecycleWorkflow.status)
    assert st.replaced == 1 and st.saved_per_hour == pytest.approx(0.176 - 0.064)
    # The fallback spend stops: its Blazar lease is deleted with its last instance.
    assert fallback_leases == 1

    async def lease_gone() -> bool:
        return not await leases_of(tc, acq)

    await eventually_async(lease_gone, timeout=60, what=f"{acq}'s lease deleted", every=1)


async def leases_of(tc: Tc, acquisition: str) -> list[str]:
    """The names of the fallback leases of `acquisition` on Blazar, read from its API."""
    return [
        x["name"]
        for x in await asyncio.to_thread(sco_leases, tc.conn)
        if (parsed := parse_lease_name(x["name"], "r1")) is not None
        and fallback_acquisition(parsed.owner) == acquisition
    ]


async def test_two_half_empty_instances_consolidate_into_one_on_nova(
    tc: Tc, workflow_env: WorkflowEnvironment
) -> None:
    """Demand 3 units held as two mem.xl (2 units each): one gp.2xl (4 units) covers it for
    less; each mem.xl is drained and deleted in turn, never two at once (budget of 1)."""
    ControlRepository(tc.pool).set_demand("r1", "cli", {CONTRACT: 3})
    old = await acquire(tc, launch("r1.A.mem.xl", 2, 4))
    old_servers = [server_of(tc, o) for o in old]
    # Two stable rounds, not the default twelve: a round is a minute of workflow time and
    # ~7 s here, and the box's test holds the default (test_lifecycle_workflow.py).
    handle = await start(tc, consolidation_stable_rounds=2, **CONFIG)
    await until_replaced_on_cloud(tc, workflow_env, 1)

    ((new, pool_id, kind, _),) = live(tc)
    assert pool_id.split(".")[2:] == ["gp", "2xl"] and kind == "reclaimable"
    on_nova = (await servers(tc))[server_of(tc, new)]
    assert on_nova.status == "ACTIVE" and on_nova.flavor.name == "gp.2xl"
    await until_gone_on_nova(tc, old_servers)
    for o in old:
        row = tc.fleet.get_instance(o)
        assert row is not None and row.state is InstanceState.DELETED
    assert sorted(n.node for n in tc.notices) == sorted(old)
    assert tc.leaving_at_notice == [1, 1]
    assert_one_at_a_time(tc)
    (replaced,) = [r for _, o, r in decisions(tc, "disruption") if o == "replaced"]
    assert replaced.startswith("consolidation: ") and "saves 0.032/h" in replaced
    st = await handle.query(LifecycleWorkflow.status)
    assert st.replaced == 2


async def test_a_contract_change_drifts_an_instance_and_replaces_it_on_nova(
    tc: Tc, workflow_env: WorkflowEnvironment
) -> None:
    (old,) = await acquire(tc, launch("r1.B.mem.xl", 1, 2))
    old_server = server_of(tc, old)
    handle = await start(tc, **CONFIG)

    async def first_round() -> bool:
        st = await handle.query(LifecycleWorkflow.status)
        return st.rounds >= 1 and not st.pending and not st.in_flight

    await poll_until(first_round, within=60)
    assert decisions(tc, "disruption") == []  # it conforms: nothing to do

    install_bundle(tc.base, BUDGET_OF_ONE, skus=["gp"])  # mem no longer allowed
    await until_replaced_on_cloud(tc, workflow_env, 1)
    ((new, pool_id, _, _),) = live(tc)
    assert pool_id.split(".")[2] == "gp"
    on_nova = (await servers(tc))[server_of(tc, new)]
    assert on_nova.status == "ACTIVE" and on_nova.flavor.name.startswith("gp.")
    await until_gone_on_nova(tc, [old_server])
    (replacing,) = [r for s, o, r in decisions(tc, "disruption") if o == "replacing"]
    assert "drift: sku mem no longer allowed" in replacing
    assert [n.node for n in tc.notices] == [old]


async def test_a_blackout_holds_the_drift_while_a_lost_hall_is_rebuilt_on_blazar(
    tc: Tc, workflow_env: WorkflowEnvironment
) -> None:
    """An open blackout on spark-etl and llm-train: a drifted spark-etl instance stays,
    while llm-train's floor (5 units here, a gpu-a.l each, at most 40 % in a hall) loses
    hall B and is rebuilt in A, C and D on Blazar leases."""
    (old,) = await acquire(tc, launch("r1.B.mem.xl", 1, 2))
    old_server = server_of(tc, old)
    # Open by the wall clock and by workflow time alike, and far ahead: the time-skipping
    # server may jump to a far timer while a wait auto-skips (a CI run saw workflow time
    # ten years on, the blackout behind it, and the drift replaced).
    times = (datetime.now(UTC), await workflow_env.get_current_time())
    window = {
        "start": (min(times) - timedelta(days=1)).isoformat(),
        "end": (max(times) + timedelta(days=365 * 100)).isoformat(),
    }
    install_bundle(
        tc.base,
        {**BUDGET_OF_ONE, "blackouts": [window]},
        also=(FLOOR,),
        floors={FLOOR: 5},
        skus=["gp"],  # mem no longer allowed: drifted
    )
    keeper = await tc.client.start_workflow(
        FloorKeeperWorkflow.run,
        FloorInput(
            region="r1",
            contract=FLOOR,
            config=FloorConfig(probe_seconds=30, reservation_poll_seconds=1),
        ),
        id=floor_workflow_id("r1", FLOOR),
        task_queue=tc.queue,
    )
    try:
        spread = await floor_holding(keeper, lambda held: sum(held.values()) == 5)
        await until_floor_on_cloud(tc, spread)
        handle = await start(tc, stable_rounds=1, **CONFIG)
        await until_held(tc, workflow_env, old, "blackout 0 is open", skip=10, every=1)

        await keeper.signal(
            FloorKeeperWorkflow.hall_lost, HallEvent(hall="B", operator="ops", reason="power")
        )
        survivors = await floor_holding(
            keeper, lambda held: "B" not in held and sum(held.values()) == 5
        )
        await until_floor_on_cloud(tc, survivors)
        await skip_time(workflow_env, 180)  # three more lifecycle rounds, still in blackout
        st = await handle.query(LifecycleWorkflow.status)
        assert st.rounds >= 4, st
        assert not any(o == "replacing" for _, o, _ in decisions(tc, "disruption"))
        assert [i for i, _, _, _ in live(tc)] == [old]
        assert (await servers(tc))[old_server].status == "ACTIVE"
        assert tc.notices == []  # no drain told
        held = [r for s, o, r in decisions(tc, "disruption") if o == "held"]
        assert len(held) == 1  # recorded once, not every round
    finally:
        with contextlib.suppress(RPCError):
            await keeper.terminate("test over")


async def floor_holding(
    keeper: WorkflowHandle[FloorKeeperWorkflow, None], done: Callable[[dict[str, int]], bool]
) -> dict[str, int]:
    """Until the keeper holds its floor with nothing pending, `done` by its halls; those."""

    async def holding() -> dict[str, int] | None:
        st = await keeper.query(FloorKeeperWorkflow.status)
        ok = st.state is FloorState.HOLDING and not st.pending and done(st.held_units_by_hall)
        return st.held_units_by_hall if ok else None

    try:
        return await eventually_async(holding, timeout=180, what="the floor held", every=1)
    except AssertionError:
        raise AssertionError(await keeper.query(FloorKeeperWorkflow.status)) from None


async def until_floor_on_cloud(tc: Tc, held: dict[str, int]) -> None:
    """Until Nova's ACTIVE floor servers on Blazar's hosts are `held` per hall (fleet state
    leads Nova by a moment)."""

    async def agrees() -> bool:
        return await asyncio.to_thread(floor_on_cloud, tc.conn, FLOOR) == held

    await eventually_async(agrees, timeout=120, what=f"Nova holding the floor {held}", every=1)
