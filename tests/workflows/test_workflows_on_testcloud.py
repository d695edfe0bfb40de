"""The durable workflows on the real OpenStack test cloud: the same workflow code as every
other test, with `OpenStackProvider` (Nova, Placement, Blazar through openstacksdk) instead
of the simulator. In order, on one worker and one fleet database:

- an acquisition of reclaimable instances;
- an acquisition whose shortfall falls back to Blazar committed capacity priced by the
  arbiter above the contract's spend authority: it waits, an operator approves, it reserves
  and boots into the reservation;
- one pool exclusion cycle with its canary booted on Nova;
- the floor keeper establishing llm-train's tier-1 floor on Blazar reservations across
  halls A-D, hall B declared lost and its share rebuilt in A/C/D, B restored and the spread
  rebalanced make-before-break;
- and at the end: no SCO server and no SCO lease on the cloud that fleet state does not
  know, counted with openstacksdk directly.

Needs the test cloud (`make testcloud-up`); skips without it (fails with
SCO_REQUIRE_TESTCLOUD=1).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from psycopg_pool import ConnectionPool
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities.budget import budget_workflow_id
from activities.events import CapacityType, InstanceState
from activities.exclusion.activities import ExclusionActivities, exclusion_activities
from activities.exclusion.models import PoolState
from activities.fleet.control_state import ControlRepository
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from activities.floor.activities import FloorActivities
from activities.floor.models import floor_workflow_id
from activities.provider.leases import fallback_acquisition, parse_lease_name
from activities.provider.openstack import OpenStackProvider
from contracts.region import Region
from planning.arbiter import price_fallback
from planning.models import ContractDemand, PoolInput
from tests.support import services
from tests.support.control_harness import poll_until, provider_worker
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO
from tests.support.testcloud import (
    floor_on_cloud,
    install_bundle,
    leave_as_found,
    provider_or_skip,
    sco_leases,
    sco_servers,
)
from tests.support.wait import eventually_async
from workflows.acquisition.models import (
    AcquisitionInput,
    AcquisitionResult,
    AcquisitionState,
    ApprovalInput,
    FallbackState,
    LaunchItem,
)
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.exclusion.client import notify_reclaim
from workflows.exclusion.models import ExclusionConfig, exclusion_workflow_id, probe_budget_key
from workflows.exclusion.workflow import PoolExclusionWorkflow
from workflows.floor.models import FloorConfig, FloorInput, FloorState, HallEvent
from workflows.floor.workflow import FloorKeeperWorkflow

pytestmark = [
    pytest.mark.testcloud,
    pytest.mark.filterwarnings("ignore::openstack.warnings.RemovedInSDK50Warning"),
    pytest.mark.filterwarnings("ignore::openstack.warnings.RemovedInSDK60Warning"),
    pytest.mark.timeout(300),
]

FLOOR_CONTRACT = "llm-train"  # r1 floor 10 units; gpu-a.l holds one


@dataclass
class Cloud:
    client: Client
    queue: str
    provider: OpenStackProvider
    fleet: FleetRepository
    pool: ConnectionPool
    # What was on the cloud before the module: not the module's to count or clean.
    servers_before: set[str]
    leases_before: set[str]
    floor: list[WorkflowHandle[FloorKeeperWorkflow, None]] = field(default_factory=list)

    @property
    def conn(self) -> Any:
        return self.provider.connection


@pytest.fixture(scope="module")
async def workflow_env() -> AsyncIterator[WorkflowEnvironment]:
    """One time-skipping server for the module: `tc` keeps a worker on it for every test."""
    env = await services.start_workflow_env()
    yield env
    await env.shutdown()


@pytest.fixture(scope="module")
async def tc(
    workflow_env: WorkflowEnvironment, region_r1: Region, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Cloud]:
    provider = provider_or_skip()
    conn = provider.connection
    servers_before = set(await asyncio.to_thread(sco_servers, conn))
    leases_before = {x["id"] for x in await asyncio.to_thread(sco_leases, conn)}
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    pool = open_pool(dsn, max_size=8)
    fleet = FleetRepository(pool)
    fleet.sync_pools(region_r1)
    base = tmp_path_factory.mktemp("testcloud")
    cache, trust = install_bundle(base)
    floor_acts = FloorActivities(
        fleet, provider, regions_dir=REGIONS_DIR, bundle_cache_dir=cache, trust_dir=trust
    )
    exclusion = ExclusionActivities(pool)
    client = workflow_env.client
    try:
        async with provider_worker(
            client,
            provider,
            fleet,
            ControlRepository(pool),
            bundle_dir=cache,
            trust_dir=trust,
            extra_workflows=[FloorKeeperWorkflow, PoolExclusionWorkflow],
            extra_activities=[
                floor_acts.snapshot,
                floor_acts.probe_halls,
                *exclusion_activities(exclusion),
            ],
        ) as queue:
            cloud = Cloud(client, queue, provider, fleet, pool, servers_before, leases_before)
            try:
                yield cloud
            finally:
                for handle in cloud.floor:
                    with contextlib.suppress(RPCError):
                        await handle.terminate("test over")
                with contextlib.suppress(RPCError):
                    await client.get_workflow_handle(
                        budget_workflow_id(probe_budget_key("r1"))
                    ).terminate()
                await _clean(cloud)
    finally:
        pool.close()
        services.drop_database(dsn)


async def _clean(cloud: Cloud) -> None:
    """Leave the cloud as the module found it: what it made goes."""
    await leave_as_found(cloud.provider, cloud.servers_before, cloud.leases_before)


async def _until(check: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    # Once a second: each look is several OpenStack API calls, and a tighter poll loads the
    # test cloud that the workflows under test are waiting on.
    await eventually_async(check, timeout=within, what=what, every=1)


def _live(cloud: Cloud, prefix: str) -> list[Any]:
    return [
        r
        for r in cloud.fleet.list_instances("r1", [InstanceState.ACTIVE])
        if (r.acquisition_id or "").startswith(prefix)
    ]


async def _start_acquisition(
    cloud: Cloud, inp: AcquisitionInput
) -> WorkflowHandle[AcquisitionWorkflow, AcquisitionResult]:
    return await cloud.client.start_workflow(
        AcquisitionWorkflow.run,
        inp,
        id=f"acq-r1-{inp.contract}-{uuid.uuid4().hex[:6]}",
        task_queue=cloud.queue,
    )


async def test_acquisition_of_reclaimable_instances(tc: Cloud) -> None:
    item = LaunchItem(pool_id="r1.A.gp.l", hall="A", flavor="gp.l", instances=3, units=3)
    inp = AcquisitionInput(region="r1", contract="tc-spot", tier=3, items=[item])
    handle = await _start_acquisition(tc, inp)
    result = await handle.result()
    p = result.progress
    assert (p.state, p.active, p.shortfall_units) == (AcquisitionState.COMPLETED, 3, 0)
    servers = await asyncio.to_thread(sco_servers, tc.conn)
    rows = _live(tc, handle.id)
    assert len(rows) == 3
    for row in rows:
        server = servers[row.provider_id]
        assert server.status == "ACTIVE" and server.availability_zone == "A"
        assert server.compute_host == "hall-a"  # the spot host, not Blazar's
        assert server.metadata["sco-capacity"] == "reclaimable"


async def _why_short(tc: Cloud, handle: WorkflowHandle[Any, Any], progress: Any) -> str:
    """What an acquisition that came up short met on the cloud: its progress, every activity
    failure in its history and the Blazar leases it made (status included), so a failure
    names its cause (a lease that went ERROR at start, a 500 from Blazar, NoValidHost)."""
    failures = [
        f"{e.activity_task_failed_event_attributes.failure.message}"
        async for e in handle.fetch_history_events()
        if e.HasField("activity_task_failed_event_attributes")
    ]
    leases = [
        f"{r.name}: {r.status}"
        for r in await tc.provider.list_reservations("r1")
        if fallback_acquisition(r.owner) == handle.id
    ]
    return f"progress {progress!r}; activity failures {failures}; leases {leases}"


async def test_fallback_to_blazar_waits_for_approval_then_boots_into_the_lease(
    tc: Cloud, region_r1: Region
) -> None:
    demand = ContractDemand(
        contract="tc-fallback",
        kind="training",
        unit_vcpu=8,
        unit_memory_gib=16,
        skus=["cpu"],
        sizes=["xl"],
        halls=["A", "B"],
        demand_units=2,
        max_units_per_region=10,
        max_pool_share=1.0,
    )
    pools = [
        PoolInput(
            pool_id=region_r1.pool_id(p),
            hall=p.hall,
            sku=p.sku,
            size=p.size,
            vcpu=p.vcpu,
            memory_gib=p.memory_gib,
            price_per_hour=p.price_per_hour,
            reclaimable_units=p.reclaimable_units,
            free=0,
        )
        for p in region_r1.pools
        if p.sku == "cpu" and p.size == "xl" and p.hall in ("A", "B")
    ]
    rates = {h: c.price_per_vcpu_hour for h, c in region_r1.committed.items()}
    plan = price_fallback(demand, 2, pools, rates, authority_per_hour=0.05)
    assert plan is not None and plan.needs_approval  # 2 x cpu.xl at 0.176/h > 0.05/h
    inp = AcquisitionInput(
        region="r1", contract="tc-fallback", tier=1, fallback=plan, approval_timeout_seconds=600
    )
    handle = await _start_acquisition(tc, inp)

    async def waiting() -> bool:
        p = await handle.query(AcquisitionWorkflow.progress)
        return p.fallback is FallbackState.AWAITING_APPROVAL

    await _until(waiting, 30, "awaiting approval")
    await handle.execute_update(
        AcquisitionWorkflow.approve_fallback,
        ApprovalInput(approver="erin", reason="quarter-end training run"),
    )
    result = await handle.result()
    p = result.progress
    assert (p.fallback, p.active, p.shortfall_units) == (FallbackState.APPROVED, 2, 0), (
        await _why_short(tc, handle, p)
    )
    leases = {
        r.hall: r
        for r in await tc.provider.list_reservations("r1")
        if fallback_acquisition(r.owner) == handle.id
    }
    assert sorted(leases) == ["A", "B"]
    assert all(r.flavor == "cpu.xl" and r.status == "ACTIVE" for r in leases.values())
    servers = await asyncio.to_thread(sco_servers, tc.conn)
    rows = _live(tc, handle.id)
    assert {r.capacity_type for r in rows} == {CapacityType.COMMITTED} and len(rows) == 2
    for row in rows:
        server = servers[row.provider_id]
        assert server.compute_host == f"hall-{row.hall.lower()}-committed"  # Blazar's host
        assert server.metadata["sco-capacity"] == "committed"


async def test_exclusion_cycle_probes_with_a_canary_on_nova(
    tc: Cloud, workflow_env: WorkflowEnvironment
) -> None:
    pool_id = "r1.C.hmem.l"
    cfg = ExclusionConfig(
        base_cooldown_seconds=3, jitter=0, probe_seconds=10, burst_merge_seconds=0
    )
    handle = tc.client.get_workflow_handle_for(
        PoolExclusionWorkflow.run, exclusion_workflow_id(pool_id)
    )
    try:
        for n in range(3):
            await notify_reclaim(
                tc.client,
                "r1",
                tc.queue,
                pool_id,
                f"tc-notice-{n}",
                await workflow_env.get_current_time(),
                config=cfg,
            )
        seen: list[PoolState] = []
        canaries: set[str] = set()

        async def cycled() -> bool:
            st = await handle.query(PoolExclusionWorkflow.status)
            if not seen or seen[-1] is not st.state:
                seen.append(st.state)
            if st.state is PoolState.PROBING and st.probe_id:
                canaries.update(
                    r.provider_id or ""
                    for r in tc.fleet.list_instances("r1", [InstanceState.ACTIVE])
                    if r.instance_id.startswith(st.probe_id)
                )
            return st.state is PoolState.ADMITTED and PoolState.PROBING in seen

        await _until(cycled, 120, "excluded, probed and re-admitted")
        assert PoolState.EXCLUDED in seen
        assert len(canaries) == 1  # the canary booted and became ACTIVE on Nova
        canary = canaries.pop()

        async def canary_gone() -> bool:
            return canary not in await asyncio.to_thread(sco_servers, tc.conn)

        await _until(canary_gone, 60, "canary deleted")
    finally:
        with contextlib.suppress(RPCError):
            await handle.terminate("test over")


async def _floor_status(
    handle: WorkflowHandle[FloorKeeperWorkflow, None],
    state: FloorState,
    held: dict[str, int],
    within: float,
) -> None:
    async def check() -> bool:
        st = await handle.query(FloorKeeperWorkflow.status)
        return st.state is state and not st.pending and st.held_units_by_hall == held

    try:
        await poll_until(check, within)
    except AssertionError:
        raise AssertionError(await handle.query(FloorKeeperWorkflow.status)) from None


def _floor_leases(leases: list[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in leases:
        if r.owner.startswith(f"floor-r1-{FLOOR_CONTRACT}-") and r.status == "ACTIVE":
            out[r.hall] = out.get(r.hall, 0) + r.amount
    return dict(sorted(out.items()))


class _CloudHolds:
    """Whether Blazar's floor leases and Nova's ACTIVE floor servers are exactly `held`;
    `last` says what the cloud held at the last look, for the failure message."""

    def __init__(self, tc: Cloud, held: dict[str, int]) -> None:
        self.tc, self.held, self.last = tc, held, "not looked at"

    async def __call__(self) -> bool:
        leases = _floor_leases(await self.tc.provider.list_reservations("r1"))
        servers = await asyncio.to_thread(floor_on_cloud, self.tc.conn, FLOOR_CONTRACT)
        self.last = f"floor leases {leases}, ACTIVE floor servers {servers}"
        return leases == self.held and servers == self.held


async def _until_cloud_holds(
    tc: Cloud,
    held: dict[str, int],
    within: float,
    what: str,
    keeper: WorkflowHandle[FloorKeeperWorkflow, None],
) -> None:
    holds = _CloudHolds(tc, held)
    try:
        await _until(holds, within, what)
    except AssertionError as exc:
        status = await keeper.query(FloorKeeperWorkflow.status)
        # Which lease each live instance booted into, so a surplus lease names its cause (a
        # release that took an instance from an old reservation, or a delete not made);
        # the keeper's history is kept beside the suite's other artefacts.
        leases = sorted(
            f"{r.owner}:{r.amount}:{r.status}"
            for r in await tc.provider.list_reservations("r1")
            if r.owner.startswith(f"floor-r1-{FLOOR_CONTRACT}-")
        )
        live = sorted(
            f"{i.acquisition_id}:{i.state.value}"
            for i in tc.fleet.list_instances("r1", [InstanceState.REQUESTED, InstanceState.ACTIVE])
            if (i.acquisition_id or "").startswith(f"floor-r1-{FLOOR_CONTRACT}-")
        )
        kept = REPO / ".sco" / "failures" / f"{keeper.id}-{uuid.uuid4().hex[:6]}.json"
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text((await keeper.fetch_history()).to_json())
        raise AssertionError(
            f"{exc}; the cloud: {holds.last}; leases {leases}; live floor instances {live}; "
            f"the keeper: {status}; its history: {kept}"
        ) from None


# The cloud's waits guard a hang, not a speed: on a loaded CI machine Blazar took over a
# minute to delete a released lease (it refuses while a lease starts or ends).
@pytest.mark.timeout(900)
async def test_floor_keeper_holds_rebuilds_and_rebalances_on_blazar(tc: Cloud) -> None:
    handle = await tc.client.start_workflow(
        FloorKeeperWorkflow.run,
        FloorInput(
            region="r1",
            contract=FLOOR_CONTRACT,
            config=FloorConfig(probe_seconds=30, reservation_poll_seconds=1),
        ),
        id=floor_workflow_id("r1", FLOOR_CONTRACT),
        task_queue=tc.queue,
    )
    tc.floor.append(handle)
    spread = {"A": 3, "B": 3, "C": 2, "D": 2}
    await _floor_status(handle, FloorState.HOLDING, spread, within=180)
    # Fleet state leads Nova by a moment (a server counted held may still be listed BUILD
    # under load), so the cloud is checked until it agrees, not in the same instant.
    await _until_cloud_holds(tc, spread, 180, f"Blazar and Nova holding {spread}", handle)

    await handle.signal(
        FloorKeeperWorkflow.hall_lost, HallEvent(hall="B", operator="ops", reason="power")
    )
    survivors = {"A": 4, "C": 3, "D": 3}
    await _floor_status(handle, FloorState.HOLDING, survivors, within=180)
    st = await handle.query(FloorKeeperWorkflow.status)
    assert st.lost_halls == ["B"] and st.last_rebuild_seconds is not None

    await _until_cloud_holds(tc, survivors, 180, "hall B's servers and lease released", handle)

    await handle.signal(
        FloorKeeperWorkflow.hall_restored, HallEvent(hall="B", operator="ops", reason="fixed")
    )
    await _floor_status(handle, FloorState.HOLDING, spread, within=180)

    await _until_cloud_holds(tc, spread, 180, "surplus released after the restore", handle)


async def test_nothing_on_the_cloud_that_fleet_state_does_not_know(tc: Cloud) -> None:
    """Counted with openstacksdk directly: every SCO server is a live fleet instance, and
    every SCO lease is one that live fleet instances boot into."""
    live = tc.fleet.list_instances("r1", [InstanceState.REQUESTED, InstanceState.ACTIVE])
    known_ids = {r.provider_id for r in live}
    acquisitions = {r.acquisition_id or "" for r in live}

    def lease_known(name: str) -> bool:
        parsed = parse_lease_name(name, "r1")
        if parsed is None:
            return False
        acq = fallback_acquisition(parsed.owner)
        if acq is not None:
            return acq in acquisitions
        return any(a.startswith(f"{parsed.owner}-") for a in acquisitions)

    async def nothing_unknown() -> bool:
        servers = set(await asyncio.to_thread(sco_servers, tc.conn)) - tc.servers_before
        leases = [
            x
            for x in await asyncio.to_thread(sco_leases, tc.conn)
            if x["id"] not in tc.leases_before
        ]
        return not (servers - known_ids) and all(lease_known(x["name"]) for x in leases)

    # Deletes on Nova are asynchronous: what the workflows released may take a moment.
    await _until(nothing_unknown, 60, "no unknown SCO server or lease")
