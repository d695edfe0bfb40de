"""LifecycleWorkflow on the time-skipping server against real PostgreSQL, real NATS with the
hall's notice relay answering drain requests, the signed bundle and the in-process simulated
cloud: fallback instances replaced by reclaimable ones when capacity returns, a contract
change drifting instances and replacing them, each within a budget of 1 and with every
decision recorded; a blackout that holds everything; pause and resume."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest
from psycopg_pool import ConnectionPool
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from activities.control.activities import ControlActivities
from activities.control.models import SnapshotInput, partition_of
from activities.events import CapacityType, EventKind, InstanceState
from activities.explain import ExplainSources, explain_instance
from activities.fleet.control_state import ControlRepository
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository, InstanceSpec
from activities.floor.models import floor_workflow_id
from activities.provider.errors import InsufficientCapacity
from activities.provider.interface import CreateRequest, ProviderInstance, ReservationRequest
from activities.provider.leases import fallback_owner, lease_name
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from tests.support import histories, services
from tests.support.control_harness import poll_until, region_worker, skip_time
from tests.support.lifecycle import (
    BUDGET_OF_ONE,
    CONTRACT,
    Life,
    assert_one_at_a_time,
    decisions,
    install_bundle,
    lifecycle_worker_kwargs,
    live,
    pause_settled,
    relays_heard,
    start,
    until_held,
    until_replaced,
)
from tests.support.paths import BASE_DSN, REGIONS_DIR
from tests.support.worker_nats import NATS_URL
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.floor.models import FloorInput, FloorState, HallEvent
from workflows.floor.workflow import FloorKeeperWorkflow
from workflows.lifecycle.models import LifecycleState, PauseInput
from workflows.lifecycle.workflow import LifecycleWorkflow

pytestmark = pytest.mark.timeout(240)


@dataclass
class ScarceCloud(SimulatedCloud):
    """The simulated cloud, with pools that have no reclaimable capacity while `scarce`."""

    scarce: set[str] = field(default_factory=set)
    # Reclaimable creates that still succeed, though free capacity shows (None: all).
    creates_left: int | None = None

    async def free_capacity(self, pool_id: str) -> int:
        free = await super().free_capacity(pool_id)
        return 0 if pool_id in self.scarce else free

    async def create(self, request: CreateRequest) -> ProviderInstance:
        if request.reservation_id is None and (
            request.pool_id in self.scarce or self.creates_left == 0
        ):
            raise InsufficientCapacity(f"No valid host was found for {request.pool_id}")
        if request.reservation_id is None and self.creates_left is not None:
            self.creates_left -= 1
        return await super().create(request)


@dataclass
class Env(Life):
    cloud: ScarceCloud


@pytest.fixture
def fresh_db(region_r1: Region) -> Iterator[tuple[FleetRepository, ConnectionPool]]:
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    pool = open_pool(dsn, max_size=8)
    repo = FleetRepository(pool)
    repo.sync_pools(region_r1)
    yield repo, pool
    pool.close()
    services.drop_database(dsn)


@pytest.fixture
async def env(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    fresh_db: tuple[FleetRepository, ConnectionPool],
    tmp_path: Path,
) -> AsyncIterator[Env]:
    fleet, pool = fresh_db
    install_bundle(tmp_path, BUDGET_OF_ONE)
    loop = asyncio.get_running_loop()
    cloud = ScarceCloud(region_r1, latency=Latency(boot_s=0.0), clock=loop.time)
    nc = await nats.connect(NATS_URL)
    notices, leaving = await relays_heard(nc, fleet, cloud)
    try:
        async with region_worker(
            workflow_env.client,
            cloud,
            fleet,
            ControlRepository(pool),
            **lifecycle_worker_kwargs(fleet, pool, cloud, tmp_path),
        ) as h:
            yield Env(
                client=workflow_env.client,
                queue=h.queue,
                fleet=fleet,
                pool=pool,
                base=tmp_path,
                notices=notices,
                leaving_at_notice=leaving,
                cloud=cloud,
            )
    finally:
        await nc.close()


async def seed(
    e: Env,
    pool_id: str,
    *,
    committed: bool,
    price: float = 0.176,
    acquisition: str | None = None,
    reservation_id: str | None = None,
) -> str:
    """An instance of spark-etl the controller acquired: committed fallback or reclaimable;
    `acquisition`: whose (default a new one); `reservation_id`: the lease it boots into."""
    acquisition = acquisition or f"acq-r1-{CONTRACT}-{uuid.uuid4().hex[:8]}"
    name = f"{acquisition}-{uuid.uuid4().hex[:4]}"
    pool = e.cloud.region.pool(pool_id)
    inst = await e.cloud.create(
        CreateRequest(
            name=name,
            region="r1",
            pool_id=pool_id,
            hall=pool.hall,
            flavor=pool.flavor,
            reservation_id=reservation_id,
        )
    )
    e.fleet.record_acquire(
        InstanceSpec(
            instance_id=name,
            region="r1",
            pool_id=pool_id,
            capacity_type=CapacityType.COMMITTED if committed else CapacityType.RECLAIMABLE,
            workload=CONTRACT,
            tier=2,
            acquisition_id=acquisition,
            price_per_hour=price if committed else None,
        )
    )
    e.fleet.record_event(name, EventKind.READY, provider_id=inst.provider_id)
    return name


async def test_a_returned_fallback_s_lease_goes_with_the_last_instance_booted_into_it(
    env: Env, workflow_env: WorkflowEnvironment
) -> None:
    """Two fallback instances of one acquisition in one Blazar lease of 2: the lease stays
    while one of them still boots into it, and is deleted with the second (the fallback
    spend stops with the instances, not when the reconciler finds an orphan lease)."""
    acq = f"acq-r1-{CONTRACT}-{uuid.uuid4().hex[:8]}"
    lease = await env.cloud.create_reservation(
        ReservationRequest(
            name=lease_name("r1", "A", "gp.xl", fallback_owner(acq)),
            region="r1",
            hall="A",
            flavor="gp.xl",
            amount=2,
            end=datetime.now(UTC) + timedelta(days=1),
        )
    )
    fallbacks = [
        await seed(
            env, "r1.A.gp.xl", committed=True, acquisition=acq, reservation_id=lease.reservation_id
        )
        for _ in range(2)
    ]
    # A lease of another acquisition in the same hall and flavor is not this one's.
    other = await env.cloud.create_reservation(
        ReservationRequest(
            name=lease_name("r1", "A", "gp.xl", fallback_owner(f"acq-r1-{CONTRACT}-other")),
            region="r1",
            hall="A",
            flavor="gp.xl",
            amount=1,
            end=datetime.now(UTC) + timedelta(days=1),
        )
    )
    handle = await start(env)
    await until_replaced(env, workflow_env, 1)
    await pause_settled(handle)
    leases = {x.lease_id for x in await env.cloud.list_reservations("r1")}
    assert leases == {lease.lease_id, other.lease_id}  # one instance still boots into it
    await handle.signal(LifecycleWorkflow.resume, PauseInput(operator="test"))
    await until_replaced(env, workflow_env, 2)
    await pause_settled(handle)
    for fb in fallbacks:
        row = env.fleet.get_instance(fb)
        assert row is not None and row.state is InstanceState.DELETED
    assert {x.lease_id for x in await env.cloud.list_reservations("r1")} == {other.lease_id}
    await handle.terminate()


async def test_fallback_returns_to_reclaimable_capacity_within_a_budget_of_one(
    env: Env, workflow_env: WorkflowEnvironment
) -> None:
    fallbacks = [await seed(env, "r1.A.gp.xl", committed=True) for _ in range(2)]
    # No reclaimable capacity anywhere spark-etl may run (gp/mem, xl/2xl).
    env.cloud.scarce = {p for p in env.cloud.region.pool_ids() if p.split(".")[2] in ("gp", "mem")}
    handle = await start(env)

    async def held_for_capacity() -> bool:
        return any("no allowed reclaimable pool" in r for _, o, r in decisions(env, "disruption"))

    await poll_until(held_for_capacity, within=30)
    assert all(t == "committed" for _, _, t, _ in live(env))

    env.cloud.scarce = set()  # capacity returns
    await until_replaced(env, workflow_env, 2)
    after = live(env)
    assert len(after) == 2 and {t for _, _, t, _ in after} == {"reclaimable"}
    assert all(a.startswith("life-r1-spark-etl-") for _, _, _, a in after)
    why = explain_instance(ExplainSources(env.pool, None, None, datetime.now(UTC)), after[0][0])
    assert why.made_by.startswith("the lifecycle workflow, replacing an instance of spark-etl")
    # The controller may release them as surplus, as it would the instances they replaced.
    control = ControlActivities(
        env.fleet,
        ControlRepository(env.pool),
        env.cloud,
        regions_dir=REGIONS_DIR,
        bundle_cache_dir=env.base / "cache",
        trust_dir=env.base / "trust",
    )
    snap = await control.snapshot(
        SnapshotInput(region="r1", partition=partition_of(CONTRACT, 4), partitions=4)
    )
    (view,) = [v for v in snap.contracts if v.demand.contract == CONTRACT]
    assert sorted(i.instance_id for i in view.instances) == sorted(i for i, _, _, _ in after)
    for fb in fallbacks:
        row = env.fleet.get_instance(fb)
        assert row is not None and row.state is InstanceState.DELETED
    assert_one_at_a_time(env)
    outcomes = [(s, o) for s, o, _ in decisions(env, "disruption")]
    for fb in fallbacks:
        assert (fb, "replacing") in outcomes
        assert (fb, "replaced") in outcomes
    # Held for hysteresis on the round capacity first came back, before it was chased.
    assert any("seen on 1 of 2 rounds" in r for _, _, r in decisions(env, "disruption"))
    # The drain was told: a signed notice for each fallback, then the release recorded.
    assert {n.node for n in env.notices} == set(fallbacks)
    assert env.leaving_at_notice == [1, 1]  # never two drains at once
    assert sorted(s for s, o, _ in decisions(env, "release") if o == "replaced") == [CONTRACT] * 2
    st = await handle.query(LifecycleWorkflow.status)
    assert st.replaced == 2 and st.saved_per_hour == pytest.approx(2 * (0.176 - 0.064))
    assert {r.reason for r in st.recent if r.outcome == "replaced"} == {"return-from-fallback"}
    desc = await handle.describe()
    assert desc.search_attributes.get("SCORegion") == ["r1"]
    await histories.record(handle, "lifecycle_return_from_fallback")
    await handle.terminate()


async def test_a_large_fallback_returns_as_smaller_instances_all_up_before_its_drain(
    env: Env, workflow_env: WorkflowEnvironment
) -> None:
    """A committed gp.2xl fallback (4 units) while reclaimable capacity comes back in xl
    (2 units) only: two reclaimable xl replace it, both ACTIVE before its one drain."""
    fb = await seed(env, "r1.A.gp.2xl", committed=True, price=0.352)
    env.cloud.scarce = {p for p in env.cloud.region.pool_ids() if p.endswith(".2xl")}
    handle = await start(env)
    await until_replaced(env, workflow_env, 1)
    after = live(env)
    assert len(after) == 2 and {t for _, _, t, _ in after} == {"reclaimable"}, after
    assert all(p.endswith(".xl") for _, p, _, _ in after)
    assert len({a for _, _, _, a in after}) == 1  # one acquisition launched both pieces
    row = env.fleet.get_instance(fb)
    assert row is not None and row.state is InstanceState.DELETED
    # One disruption: the fallback's drain, told once, after both pieces were up.
    assert [n.node for n in env.notices] == [fb] and env.leaving_at_notice == [1]
    disruption = decisions(env, "disruption")
    (replacing,) = [r for s, o, r in disruption if o == "replacing" and s == fb]
    assert "as 2 smaller instances" in replacing and " + " in replacing
    (replaced,) = [r for s, o, r in disruption if o == "replaced" and s == fb]
    assert replaced.startswith("return-from-fallback: ") and "saves 0.224/h" in replaced
    st = await handle.query(LifecycleWorkflow.status)
    assert st.replaced == 1 and st.saved_per_hour == pytest.approx(0.352 - 2 * 0.064)
    (rec,) = [r for r in st.recent if r.outcome == "replaced"]
    assert sorted(rec.replacement.split(", ")) == sorted(i for i, _, _, _ in after)
    await histories.record(handle, "lifecycle_return_in_parts")
    await handle.terminate()


async def test_a_fallback_stays_when_only_some_of_its_smaller_replacements_come_up(
    env: Env, workflow_env: WorkflowEnvironment
) -> None:
    """Make-before-break for every piece: one xl of two boots, the other is refused; the
    one is released again and the fallback serves on, never drained."""
    fb = await seed(env, "r1.A.gp.2xl", committed=True, price=0.352)
    env.cloud.scarce = {p for p in env.cloud.region.pool_ids() if p.endswith(".2xl")}
    env.cloud.creates_left = 1
    handle = await start(env)

    await until_held(env, workflow_env, fb, "not every piece became ACTIVE (1 of 2)")
    await pause_settled(handle)
    assert [i for i, _, _, _ in live(env)] == [fb] and env.notices == []
    released = [r for _, o, r in decisions(env, "release") if o == "released"]
    assert any("not every piece became ACTIVE" in r for r in released), released
    await handle.terminate()


async def test_a_contract_change_drifts_instances_and_replaces_them_one_at_a_time(
    env: Env, workflow_env: WorkflowEnvironment
) -> None:
    old = [await seed(env, "r1.B.mem.xl", committed=False) for _ in range(2)]
    handle = await start(env)

    async def first_round() -> bool:
        return (await handle.query(LifecycleWorkflow.status)).rounds >= 1

    await poll_until(first_round, within=30)
    assert decisions(env, "disruption") == []  # they conform: nothing to do

    install_bundle(env.base, BUDGET_OF_ONE, skus=["gp"])  # mem no longer allowed
    await until_replaced(env, workflow_env, 2)
    after = live(env)
    assert len(after) == 2 and all(p.split(".")[2] == "gp" for _, p, _, _ in after)
    assert_one_at_a_time(env)
    replacing = [r for s, o, r in decisions(env, "disruption") if o == "replacing"]
    assert len(replacing) == 2 and all("drift: sku mem no longer allowed" in r for r in replacing)
    assert {n.node for n in env.notices} == set(old)
    assert env.leaving_at_notice == [1, 1]  # never two drains at once
    await handle.terminate()


async def test_a_blackout_holds_every_voluntary_disruption_while_a_hall_loss_is_rebuilt(
    env: Env, workflow_env: WorkflowEnvironment
) -> None:
    """An open blackout on spark-etl and llm-train: the lifecycle replaces nothing, while
    llm-train's floor keeper still rebuilds a lost hall's share (never voluntary, never
    blocked). Then pause and resume, recorded."""
    now = datetime.now(UTC)
    window = {
        "start": (now - timedelta(days=1)).isoformat(),
        "end": (now + timedelta(days=1)).isoformat(),
    }
    install_bundle(env.base, {**BUDGET_OF_ONE, "blackouts": [window]}, also=("llm-train",))
    fb = await seed(env, "r1.A.gp.xl", committed=True)
    keeper = await env.client.start_workflow(
        FloorKeeperWorkflow.run,
        FloorInput(region="r1", contract="llm-train"),
        id=floor_workflow_id("r1", "llm-train"),
        task_queue=env.queue,
    )

    async def floor_holds(held: dict[str, int]) -> bool:
        st = await keeper.query(FloorKeeperWorkflow.status)
        return st.state is FloorState.HOLDING and not st.pending and st.held_units_by_hall == held

    await poll_until(lambda: floor_holds({"A": 3, "B": 3, "C": 2, "D": 2}), within=60)
    handle = await start(env, stable_rounds=1)

    await until_held(env, workflow_env, fb, "blackout 0 is open")
    # A hall lost in the blackout: the floor is rebuilt in the survivors all the same.
    env.cloud.fail_hall("B")
    await keeper.signal(FloorKeeperWorkflow.hall_lost, HallEvent(hall="B", operator="ops"))
    await poll_until(lambda: floor_holds({"A": 4, "C": 3, "D": 3}), within=60)
    await skip_time(workflow_env, 180)
    assert not any(o == "replacing" for _, o, _ in decisions(env, "disruption"))
    assert [i for i, _, _, _ in live(env)] == [fb]
    assert {n.node for n in env.notices}.isdisjoint({fb})
    held = [r for s, o, r in decisions(env, "disruption") if o == "held"]
    assert len(held) == 1  # recorded once, not every round
    await keeper.terminate()

    await handle.signal(LifecycleWorkflow.pause, PauseInput(operator="ops", reason="freeze"))

    async def paused() -> bool:
        st = await handle.query(LifecycleWorkflow.status)
        return st.state is LifecycleState.PAUSED and not st.pending

    await poll_until(paused, within=30)
    desc = await handle.describe()
    assert desc.search_attributes.get("SCOState") == ["paused"]
    await handle.signal(LifecycleWorkflow.resume, PauseInput(operator="ops"))

    async def resumed() -> bool:
        st = await handle.query(LifecycleWorkflow.status)
        return st.state is LifecycleState.WATCHING and not st.pending and not st.paused

    await poll_until(resumed, within=30)
    ops = [(o, r) for s, o, r in decisions(env, "disruption") if s == "r1"]
    assert [o for o, _ in ops] == ["paused", "resumed"] and "freeze" in ops[0][1]
    await handle.terminate()


async def test_two_half_empty_instances_consolidate_into_one_within_a_budget_of_one(
    env: Env, workflow_env: WorkflowEnvironment
) -> None:
    """Demand 3 units held as two mem.xl (2 units, 0.08/h each): one gp.2xl (4 units,
    0.128/h) covers it for less. Neither mem.xl alone can go (a plain release), so the
    lifecycle consolidates: the gp.2xl first, then each mem.xl drained and deleted in turn."""
    ControlRepository(env.pool).set_demand("r1", "cli", {CONTRACT: 3})
    old = [await seed(env, "r1.A.mem.xl", committed=False) for _ in range(2)]
    handle = await start(env)
    await until_replaced(env, workflow_env, 1)
    after = live(env)
    assert len(after) == 1 and after[0][1].split(".")[2:] == ["gp", "2xl"], after
    for o in old:
        row = env.fleet.get_instance(o)
        assert row is not None and row.state is InstanceState.DELETED
    # Told both drains, one at a time: never two of them leaving at once.
    assert sorted(n.node for n in env.notices) == sorted(old)
    assert env.leaving_at_notice == [1, 1]
    disruption = decisions(env, "disruption")
    assert any("hysteresis" in r for _, o, r in disruption if o == "held")  # waited a round
    (replaced,) = [r for _, o, r in disruption if o == "replaced"]
    assert replaced.startswith("consolidation: ") and "saves 0.032/h" in replaced
    assert len([s for s, o, _ in decisions(env, "release") if o == "replaced"]) == 2
    st = await handle.query(LifecycleWorkflow.status)
    assert st.replaced == 2 and st.saved_per_hour == pytest.approx(0.032)
    await histories.record(handle, "lifecycle_consolidation")
    await handle.terminate()


async def test_a_return_the_spread_group_rules_out_is_held_and_explained(
    env: Env, workflow_env: WorkflowEnvironment
) -> None:
    """The snapshot carries spark-etl's spread group as the controller plans with it: a
    demand of 2 units allows 1 in one pool (0.25 of 2, at least 1), under one gp.xl (2
    units): one for one, the fallback stays, and the ledger's `held` decision (the line
    `sco explain contract` shows for the instance) says why."""
    install_bundle(env.base, BUDGET_OF_ONE, spread_groups=["batch"])
    ControlRepository(env.pool).set_demand("r1", "cli", {CONTRACT: 2})
    fb = await seed(env, "r1.A.gp.xl", committed=True)
    env.cloud.scarce = {p for p in env.cloud.region.pool_ids() if p != "r1.B.gp.xl"}
    handle = await start(env, max_return_parts=1)
    await until_held(env, workflow_env, fb, "spread: the replacement would put 2 units")
    await pause_settled(handle)
    assert [i for i, *_ in live(env)] == [fb] and env.notices == []
    (why,) = [r for s, o, r in decisions(env, "disruption") if s == fb and o == "held"]
    assert why == (
        "return-from-fallback: spread: the replacement would put 2 units of spread group "
        "batch in pool r1.B.gp.xl (0 there now), spread allows 1 in one pool "
        "(spread_max_pool_fraction 0.25 of the group's 2 units)"
    )
    await handle.terminate()


@pytest.mark.parametrize(
    "scenario",
    [
        "lifecycle_return_from_fallback",
        "lifecycle_consolidation",
        "lifecycle_return_in_parts",
        # Recorded by the code before return in parts: a gp.2xl fallback held round after
        # round with only xl free. Replayed, the rounds plan one for one (not patched).
        "lifecycle_fallback_held_one_for_one",
    ],
)
async def test_recorded_histories_replay(scenario: str) -> None:
    """A change to the workflow that would break a running one fails here: patch it."""
    replayer = Replayer(
        workflows=[LifecycleWorkflow, AcquisitionWorkflow], data_converter=pydantic_data_converter
    )
    for stem in histories.recorded(scenario):
        await replayer.replay_workflow(histories.load(stem))


async def test_no_drain_without_a_relay_keeps_the_old_instance_and_releases_the_replacement(
    env: Env, workflow_env: WorkflowEnvironment
) -> None:
    fb = await seed(env, "r1.D.gp.xl", committed=True)  # hall D: no relay answers
    handle = await start(env, drain_attempts=1)

    await until_held(env, workflow_env, fb, "no notice relay runs for r1/D")
    # Later rounds boot no second replacement just to release it again: the hall waits.
    await skip_time(workflow_env, 200)

    async def hall_waits() -> bool:
        return any(
            s == fb and o == "held" and "no drain can be told in hall D" in r
            for s, o, r in decisions(env, "disruption")
        )

    await poll_until(hall_waits, within=30)
    assert "D" in (await handle.query(LifecycleWorkflow.status)).undrainable
    await pause_settled(handle)
    # The old instance serves on, never broken without a drain; its replacement went again.
    rows = [r for r in env.fleet.list_instances("r1") if r.workload == CONTRACT]
    states = {r.instance_id: r.state for r in rows}
    assert states.pop(fb) is InstanceState.ACTIVE and env.notices == []
    assert len(states) == 1 and set(states.values()) == {InstanceState.DELETED}
    assert any(o == "released" and "not told" in r for _, o, r in decisions(env, "release"))
    await handle.terminate()
