"""workflows/controller/reconcile.py: the controller's decisions for one snapshot, as tables.

Most cases hand `reconcile` the plan (as the exact planner's caller does), so each row
tests one decision: what becomes an acquisition and how it is split, when committed
fallback is priced and where it rides, which instances are named surplus, and the totals.
The last ones go through the greedy planner, as a tick without an exact plan does.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities.control.models import ContractView, ControllerSnapshot, InstanceBrief
from activities.events import CapacityType, InstanceState
from contracts.model import WorkloadKind
from contracts.pool_id import PoolId
from planning.models import Allocation, ContractDemand, ContractOutcome, Plan, PoolInput
from planning.planner import plan
from workflows.controller.models import ControllerConfig
from workflows.controller.reconcile import ReconcileResult, plan_input, reconcile

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
CFG = ControllerConfig()
A_L, B_L, A_XL = "r1.A.gp.l", "r1.B.gp.l", "r1.A.gp.xl"
# A unit is 4 vCPU / 16 GiB: an `l` (8 / 32) holds 2 units, an `xl` (16 / 64) holds 4.
SHAPES = {"l": (8, 32), "xl": (16, 64)}


def pool(pool_id: str, *, price: float = 1.0, free: int = 50) -> PoolInput:
    pid = PoolId.parse(pool_id)
    vcpu, memory = SHAPES[pid.size]
    return PoolInput(
        pool_id=pool_id,
        hall=pid.hall,
        sku=pid.sku,
        size=pid.size,
        vcpu=vcpu,
        memory_gib=memory,
        price_per_hour=price,
        reclaimable_units=100,
        free=free,
    )


POOLS = [pool(A_L), pool(B_L), pool(A_XL, price=2.5)]


def view(contract: str = "c", units: int = 10, **kw: Any) -> ContractView:
    demand = ContractDemand(
        contract=contract,
        kind=WorkloadKind.SPARK.value,
        unit_vcpu=4,
        unit_memory_gib=16,
        skus=["gp"],
        sizes=["l", "xl"],
        halls=["A", "B"],
        demand_units=units,
        max_units_per_region=1000,
        max_pool_share=1.0,
        existing=kw.pop("existing", {}),
    )
    return ContractView(demand=demand, tier=kw.pop("tier", 2), authority_per_hour=100.0, **kw)


def snapshot(*views: ContractView, committed: dict[str, float] | None = None) -> ControllerSnapshot:
    return ControllerSnapshot(
        region="r1",
        partition=0,
        contracts=list(views),
        pools=POOLS,
        committed_rate={"A": 0.05, "B": 0.05} if committed is None else committed,
    )


def allocation(contract: str, pool_id: str, instances: int, units: int) -> Allocation:
    return Allocation(
        contract=contract,
        pool_id=pool_id,
        hall=PoolId.parse(pool_id).hall,
        instances=instances,
        units=units,
        cost_per_hour=float(instances),
    )


def outcome(contract: str, demand: int, **kw: int) -> ContractOutcome:
    return ContractOutcome(
        contract=contract,
        demand_units=demand,
        target_units=demand,
        held_units=kw.get("held", 0),
        planned_units=kw.get("planned", 0),
        shortfall_units=kw.get("shortfall", 0),
        surplus_units=kw.get("surplus", 0),
    )


def planned(allocations: list[Allocation], *outcomes: ContractOutcome) -> Plan:
    return Plan(
        allocations=allocations,
        outcomes=list(outcomes),
        cost_per_hour=sum(a.cost_per_hour for a in allocations),
    )


def instance(
    iid: str,
    pool_id: str = A_L,
    *,
    price: float = 1.0,
    committed: bool = False,
    state: InstanceState = InstanceState.ACTIVE,
) -> InstanceBrief:
    return InstanceBrief(
        instance_id=iid,
        pool_id=pool_id,
        hall=PoolId.parse(pool_id).hall,
        state=state,
        capacity_type=CapacityType.COMMITTED if committed else CapacityType.RECLAIMABLE,
        price_per_hour=price,
    )


# --- plan_input: what is already on its way is not planned again ---------------------------


@pytest.mark.parametrize(
    ("demand", "outstanding", "fallback", "planned_for"),
    [
        (10, 0, 0, 10),
        (10, 4, 0, 6),  # open acquisitions ask for 4
        (10, 0, 3, 7),  # committed fallback covers 3
        (10, 4, 3, 3),
        (10, 8, 5, 0),  # more on its way than wanted: nothing, never negative
        (0, 2, 0, 0),
    ],
)
def test_plan_input_nets_in_flight_work(
    demand: int, outstanding: int, fallback: int, planned_for: int
) -> None:
    v = view(units=demand, outstanding_units=outstanding, fallback_units=fallback)
    cfg = ControllerConfig(spread_max_pool_fraction=0.5)
    got = plan_input(snapshot(v), cfg)
    assert [c.demand_units for c in got.contracts] == [planned_for]
    assert got.contracts[0].model_copy(update={"demand_units": demand}) == v.demand
    assert got.pools == POOLS
    assert got.spread_max_pool_fraction == 0.5


def test_no_contracts_no_decisions() -> None:
    assert reconcile(snapshot(), CFG, NOW) == ReconcileResult()


# --- allocations into acquisitions, split at the per-acquisition cap ----------------------

Item = tuple[str, int, int]  # (pool id, instances, units)


@pytest.mark.parametrize(
    ("allocs", "cap", "chunks"),
    [
        pytest.param([(A_L, 3, 6)], 5, [[(A_L, 3, 6)]], id="under the cap"),
        pytest.param([(A_L, 5, 10)], 5, [[(A_L, 5, 10)]], id="exactly the cap"),
        pytest.param([(A_L, 7, 14)], 5, [[(A_L, 5, 10)], [(A_L, 2, 4)]], id="one item split"),
        pytest.param(
            [(A_L, 7, 13)], 5, [[(A_L, 5, 10)], [(A_L, 2, 3)]], id="partly used instance last"
        ),
        pytest.param(
            [(A_L, 12, 24)],
            5,
            [[(A_L, 5, 10)], [(A_L, 5, 10)], [(A_L, 2, 4)]],
            id="one item over three",
        ),
        pytest.param(
            [(A_L, 3, 6), (B_L, 4, 8)],
            5,
            [[(A_L, 3, 6), (B_L, 2, 4)], [(B_L, 2, 4)]],
            id="second item fills the first chunk",
        ),
        pytest.param(
            [(A_L, 2, 4), (B_L, 3, 6), (A_XL, 1, 4)],
            5,
            [[(A_L, 2, 4), (B_L, 3, 6)], [(A_XL, 1, 4)]],
            id="a full chunk closes",
        ),
        pytest.param([(A_L, 1, 2), (B_L, 1, 2)], 1, [[(A_L, 1, 2)], [(B_L, 1, 2)]], id="cap 1"),
    ],
)
def test_allocations_become_acquisitions_split_at_the_cap(
    allocs: list[Item], cap: int, chunks: list[list[Item]]
) -> None:
    units = sum(u for _, _, u in allocs)
    p = planned([allocation("c", *a) for a in allocs], outcome("c", units, planned=units))
    cfg = ControllerConfig(max_instances_per_acquisition=cap)
    out = reconcile(snapshot(view(units=units, tier=3)), cfg, NOW, p)
    assert [[(i.pool_id, i.instances, i.units) for i in r.items] for r in out.acquisitions] == (
        chunks
    )
    for req in out.acquisitions:
        assert (req.contract, req.tier, req.fallback) == ("c", 3, None)
        for item in req.items:
            pid = PoolId.parse(item.pool_id)
            assert (item.hall, item.flavor) == (pid.hall, pid.flavor)


# --- committed fallback: when it is priced --------------------------------------------------

TIMEOUT = timedelta(seconds=CFG.approval_timeout_seconds)


@pytest.mark.parametrize(
    ("shortfall", "view_kw", "committed", "falls_back"),
    [
        pytest.param(4, {}, None, True, id="short, nothing in flight"),
        pytest.param(0, {}, None, False, id="not short"),
        pytest.param(4, {"outstanding_units": 2}, None, False, id="launches still in flight"),
        pytest.param(4, {"awaiting_approval": True}, None, False, id="one awaits approval"),
        pytest.param(
            4, {"fallback_declined_at": NOW - timedelta(minutes=1)}, None, False, id="declined now"
        ),
        pytest.param(
            4,
            {"fallback_declined_at": NOW - TIMEOUT + timedelta(seconds=1)},
            None,
            False,
            id="declined, timeout not yet over",
        ),
        pytest.param(
            4, {"fallback_declined_at": NOW - TIMEOUT}, None, True, id="declined, timeout over"
        ),
        pytest.param(
            4, {"fallback_declined_at": NOW - 10 * TIMEOUT}, None, True, id="declined long ago"
        ),
        pytest.param(4, {}, {"C": 0.05}, False, id="no committed capacity in its halls"),
        pytest.param(4, {}, {}, False, id="no committed capacity at all"),
    ],
)
def test_when_committed_fallback_is_priced(
    shortfall: int, view_kw: dict[str, Any], committed: dict[str, float] | None, falls_back: bool
) -> None:
    p = planned([], outcome("c", 10, held=10 - shortfall, shortfall=shortfall))
    out = reconcile(snapshot(view(**view_kw), committed=committed), CFG, NOW, p)
    fallbacks = [r.fallback for r in out.acquisitions if r.fallback is not None]
    assert len(fallbacks) == (1 if falls_back else 0)
    assert out.acquisitions == [] or falls_back
    if falls_back:
        (fb,) = fallbacks
        assert (fb.contract, fb.shortfall_units) == ("c", shortfall)
        assert fb.units >= shortfall
        assert {i.hall for i in fb.items} <= set(committed or {"A", "B"})


@pytest.mark.parametrize(
    ("allocs", "shape"),
    [
        # (contract, pool id, instances, units) -> per request: (contract, instances, fallback?)
        pytest.param([], [("c", 0, True)], id="fallback alone"),
        pytest.param([("c", A_L, 3, 6)], [("c", 3, True)], id="on its only acquisition"),
        pytest.param(
            [("c", A_L, 7, 14)], [("c", 5, False), ("c", 2, True)], id="on its last chunk"
        ),
        pytest.param(
            [("b", A_L, 2, 4)],
            [("b", 2, False), ("c", 0, True)],
            id="never on another contract's",
        ),
    ],
)
def test_where_the_fallback_rides(
    allocs: list[tuple[str, str, int, int]], shape: list[tuple[str, int, bool]]
) -> None:
    cfg = ControllerConfig(max_instances_per_acquisition=5)
    contracts = sorted({a[0] for a in allocs} | {"c"})
    outcomes = [
        outcome("c", 20, planned=sum(a[3] for a in allocs if a[0] == "c"), shortfall=4)
        if c == "c"
        else outcome(c, 4, planned=4)
        for c in contracts
    ]
    p = planned([allocation(*a) for a in allocs], *outcomes)
    views = [view(c, units=20 if c == "c" else 4) for c in contracts]
    out = reconcile(snapshot(*views), cfg, NOW, p)
    assert [
        (r.contract, sum(i.instances for i in r.items), r.fallback is not None)
        for r in out.acquisitions
    ] == shape


# --- surplus: which instances the controller may release -----------------------------------


@pytest.mark.parametrize(
    ("instances", "surplus", "released"),
    [
        pytest.param([instance("i1")], 0, [], id="no surplus"),
        pytest.param(
            [instance("r1", price=2.0), instance("c1", committed=True, price=1.0)],
            2,
            ["c1"],
            id="committed fallback first",
        ),
        pytest.param(
            [instance("cheap", price=1.0), instance("dear", price=3.0)],
            2,
            ["dear"],
            id="then the most expensive",
        ),
        pytest.param([instance("i2"), instance("i1")], 2, ["i1"], id="ties by instance id"),
        pytest.param(
            [instance("gone", price=9.0, state=InstanceState.NOTICED), instance("up")],
            2,
            ["up"],
            id="only ACTIVE instances",
        ),
        pytest.param(
            [instance("elsewhere", "r1.C.gp.l", price=9.0), instance("here")],
            2,
            ["here"],
            id="only pools of the snapshot",
        ),
        pytest.param(
            [instance("big", A_XL, price=5.0), instance("small")],
            3,
            ["small"],
            id="an instance worth more than the surplus stays",
        ),
        pytest.param(
            [instance("a"), instance("b"), instance("c")], 5, ["a", "b"], id="up to the surplus"
        ),
        pytest.param(
            [instance("big", A_XL, price=5.0), instance("a"), instance("b")],
            8,
            ["big", "a", "b"],
            id="all of it",
        ),
    ],
)
def test_surplus_names_the_instances_to_release(
    instances: list[InstanceBrief], surplus: int, released: list[str]
) -> None:
    p = planned([], outcome("c", 2, held=2 + surplus, surplus=surplus))
    out = reconcile(snapshot(view(units=2, instances=instances)), CFG, NOW, p)
    assert out.surplus == released
    assert out.acquisitions == []


# --- totals --------------------------------------------------------------------------------


def test_totals_add_up_over_contracts_demand_as_asked() -> None:
    p = planned(
        [allocation("a", A_L, 2, 4), allocation("b", B_L, 1, 2)],
        outcome("a", 6, held=2, planned=4),
        outcome("b", 5, held=0, planned=2, shortfall=3),
    )
    snap = snapshot(
        view("a", units=10, outstanding_units=4),  # planned for 6, demand is still 10
        view("b", units=5, awaiting_approval=True),
    )
    out = reconcile(snap, CFG, NOW, p)
    assert (out.demand_units, out.held_units, out.planned_units, out.shortfall_units) == (
        15,
        2,
        6,
        3,
    )
    assert out.plan_cost_per_hour == p.cost_per_hour
    assert [(r.contract, r.fallback) for r in out.acquisitions] == [("a", None), ("b", None)]


# --- without a plan: the greedy planner's -------------------------------------------------


@pytest.mark.parametrize(
    ("demand", "outstanding", "fallback", "existing", "instances"),
    [
        (6, 0, 0, {}, 3),  # 2 units per `l` instance
        (7, 0, 0, {}, 4),  # the last one partly used
        (10, 4, 0, {}, 3),  # open acquisitions cover 4
        (10, 0, 4, {}, 3),  # committed fallback covers 4
        (10, 0, 0, {A_L: 2}, 3),  # 2 held instances cover 4
        (4, 0, 0, {A_L: 2}, 0),  # held covers all
    ],
)
def test_the_greedy_plan_when_none_is_given(
    demand: int, outstanding: int, fallback: int, existing: dict[str, int], instances: int
) -> None:
    snap = snapshot(
        view(
            units=demand, outstanding_units=outstanding, fallback_units=fallback, existing=existing
        )
    )
    out = reconcile(snap, CFG, NOW)
    assert sum(i.instances for r in out.acquisitions for i in r.items) == instances
    assert out.demand_units == demand
    assert out == reconcile(snap, CFG, NOW, plan(plan_input(snap, CFG)))
