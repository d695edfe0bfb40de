"""planning/lifecycle.py keeps every voluntary replacement (return from fallback, whole or
in pieces, drift, expiry, consolidation) to the contract's spread groups as the
controller's planner keeps its acquisitions to them (planning/planner.py: a group's
members hold at most planning/costs.spread_cap units in one pool), and says so in the
recorded why when the spread holds one back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from contracts.disruption import DisruptionReason
from contracts.model import Contract
from planning.costs import spread_cap
from planning.lifecycle import (
    AntiChurn,
    ContractLife,
    LifeInstance,
    LifePool,
    SpreadMember,
    SpreadRoom,
    plan_lifecycle,
    spread_rooms,
)
from tests.support.contract_fixtures import example

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
RETURN = DisruptionReason.RETURN_FROM_FALLBACK
CONSOLIDATE = DisruptionReason.CONSOLIDATION
FIVE = {"budgets": [{"max_instances": 5}]}


def contract(name: str = "spark-etl", **extra: Any) -> Contract:
    doc = example("spark-etl")  # gp/mem, xl/2xl, halls A-D, unit 4 vCPU / 16 GiB, group batch
    doc["name"] = name
    doc["disruption"] = FIVE
    doc.update(extra)
    return Contract.model_validate(doc, strict=False)


def inst(
    iid: str,
    pool_id: str = "r1.A.gp.xl",
    *,
    workload: str = "spark-etl",
    fallback: bool = False,
    units: int = 2,
    price: float = 0.064,
    age_hours: float = 5.0,
) -> LifeInstance:
    _, hall, sku, size = pool_id.split(".")
    return LifeInstance(
        instance_id=iid,
        region="r1",
        workload=workload,
        pool_id=pool_id,
        hall=hall,
        sku=sku,
        size=size,
        committed=fallback,
        fallback=fallback,
        created_at=NOW - timedelta(hours=age_hours),
        price_per_hour=price,
        units=units,
    )


def fallback(iid: str = "fb", units: int = 2, price: float = 0.176, **kw: Any) -> LifeInstance:
    size = "xl" if units == 2 else "2xl"
    return inst(iid, f"r1.A.gp.{size}", fallback=True, units=units, price=price, **kw)


def pool(pid: str, *, price: float = 0.064, free: int = 5) -> LifePool:
    _, hall, sku, size = pid.split(".")
    return LifePool(
        pool_id=pid,
        hall=hall,
        flavor=f"{sku}.{size}",
        price_per_hour=price,
        units=2 if size == "xl" else 4,
        free=free,
    )


def batch(cap: int, **used: int) -> SpreadRoom:
    """Spread group batch with `cap` units per pool; `used`: units per pool (B="r1.B.gp.xl")."""
    return SpreadRoom(
        group="batch",
        cap_units=cap,
        fraction=0.25,
        target_units=cap * 4,
        used={f"r1.{k.replace('_', '.')}": v for k, v in used.items()},
    )


def view(
    c: Contract,
    instances: list[LifeInstance],
    pools: list[LifePool],
    spread: list[SpreadRoom],
    demand: int | None = None,
) -> ContractLife:
    return ContractLife(
        contract=c, instances=instances, pools=pools, spread=spread, demand_units=demand
    )


B, C, D = "r1.B.gp.xl", "r1.C.gp.xl", "r1.D.gp.xl"
STABLE = {B: 2, C: 2, D: 2, "r1.B.gp.2xl": 2}


def test_spread_rooms_are_the_planners_caps_over_the_groups_members() -> None:
    rooms = spread_rooms(
        [
            SpreadMember(groups=["batch"], target_units=10, used={B: 2, C: 4}),
            SpreadMember(groups=["batch", "svc"], target_units=6, used={B: 2}),
            SpreadMember(groups=[], target_units=50, used={B: 8}),  # in no group
        ],
        0.25,
    )
    assert sorted(rooms) == ["batch", "svc"]
    assert rooms["batch"].cap_units == spread_cap(0.25, 16) == 4
    assert rooms["batch"].used == {B: 4, C: 4}
    assert (rooms["svc"].cap_units, rooms["svc"].used) == (spread_cap(0.25, 6), {B: 2})


def test_a_return_skips_the_cheapest_pool_when_the_spread_group_is_full_there() -> None:
    pools = [pool(B, price=0.05), pool(C, price=0.064)]
    v = view(contract(), [fallback()], pools, [batch(4, B_gp_xl=4)])
    (r,) = plan_lifecycle([v], now=NOW, free_streak=STABLE).replace
    assert (r.reason, r.pool_id) == (RETURN, C)
    # No spread group (or a snapshot from before it): the cheapest pool, as before.
    (r,) = plan_lifecycle(
        [v.model_copy(update={"spread": []})], now=NOW, free_streak=STABLE
    ).replace
    assert r.pool_id == B


def test_a_return_the_spread_rules_out_is_held_and_the_why_says_so() -> None:
    v = view(contract(), [fallback()], [pool(B)], [batch(2, B_gp_xl=2)])
    plan = plan_lifecycle([v], now=NOW, free_streak=STABLE)
    assert plan.replace == []
    assert [(h.instance_id, h.reason, h.why) for h in plan.held] == [
        (
            "fb",
            RETURN,
            "spread: the replacement would put 4 units of spread group batch in pool "
            "r1.B.gp.xl (2 there now), spread allows 2 in one pool "
            "(spread_max_pool_fraction 0.25 of the group's 8 units)",
        )
    ]


def test_pieces_spread_over_pools_and_are_held_when_only_one_pool_has_room() -> None:
    big = fallback(units=4, price=0.352)
    two = [pool(B, price=0.05), pool(C)]
    # Without the spread both xl go to the cheapest pool, B; with a cap of 2 one goes to C.
    (r,) = plan_lifecycle(
        [view(contract(), [big], two, [batch(2)])], now=NOW, free_streak=STABLE
    ).replace
    assert [(p.pool_id, p.units) for p in r.parts] == [(B, 2), (C, 2)]
    (r,) = plan_lifecycle([view(contract(), [big], two, [])], now=NOW, free_streak=STABLE).replace
    assert [p.pool_id for p in r.parts] == [B, B]
    # Only B: the pieces would put all 4 units there.
    plan = plan_lifecycle(
        [view(contract(), [big], [pool(B)], [batch(2)])], now=NOW, free_streak=STABLE
    )
    assert plan.replace == []
    assert plan.held[0].why == (
        "spread: the pieces would put 4 units of spread group batch in pool r1.B.gp.xl "
        "(0 there now), spread allows 2 in one pool (spread_max_pool_fraction 0.25 of the "
        "group's 8 units)"
    )


def test_a_cap_under_one_instance_takes_partly_used_pieces_as_the_planner_does() -> None:
    # A cap of 1 unit per pool: the planner covers 2 units with two xl, one unit used in
    # each; a 2-unit fallback returns the same way (its replacement alone would break it).
    v = view(contract(), [fallback()], [pool(B), pool(C)], [batch(1)])
    (r,) = plan_lifecycle([v], now=NOW, free_streak=STABLE).replace
    assert [p.pool_id for p in r.parts] == [B, C]
    one_for_one = plan_lifecycle(
        [v], now=NOW, free_streak=STABLE, anti_churn=AntiChurn(max_return_parts=1)
    )
    assert one_for_one.replace == [] and one_for_one.held[0].why.startswith(
        "spread: the replacement would put 2 units of spread group batch in pool r1.B.gp.xl"
    )


def test_drift_and_expiry_replacements_keep_to_the_spread_and_free_their_own_units() -> None:
    # mem no longer allowed: drifted. The cheaper B is full for the group; C's gp.xl pool
    # has room.
    drifted = contract(placement={**example("spark-etl")["placement"], "skus": ["gp"]})
    mem = inst("mem", "r1.C.mem.xl")
    pools = [pool(B, price=0.05), pool(C)]
    plan = plan_lifecycle(
        [view(drifted, [mem], pools, [batch(2, B_gp_xl=2, C_mem_xl=2)])],
        now=NOW,
        free_streak=STABLE,
    )
    assert [(r.reason, r.pool_id) for r in plan.replace] == [(DisruptionReason.DRIFT, C)]
    # Every allowed pool full: held, with the spread's why.
    full = [batch(2, B_gp_xl=2, C_gp_xl=2)]
    plan = plan_lifecycle([view(drifted, [mem], pools, full)], now=NOW, free_streak=STABLE)
    assert plan.replace == [] and plan.held[0].reason is DisruptionReason.DRIFT
    assert plan.held[0].why.startswith("spread: the replacement would put 4 units")
    # An expired instance replaced in its own pool frees its units there first.
    aged = contract(disruption={**FIVE, "max_instance_age_hours": 1})
    old = inst("old", B, age_hours=50)
    plan = plan_lifecycle(
        [view(aged, [old], [pool(B)], [batch(2, B_gp_xl=2)])], now=NOW, free_streak=STABLE
    )
    assert [(r.reason, r.pool_id) for r in plan.replace] == [(DisruptionReason.EXPIRY, B)]


def test_contracts_of_one_group_share_its_room_in_a_round() -> None:
    a, b = contract("spark-a"), contract("spark-b")
    pools = [pool(B, price=0.05), pool(C)]
    group = [batch(2)]
    plan = plan_lifecycle(
        [
            view(a, [fallback("fb-a", workload="spark-a")], pools, group),
            view(b, [fallback("fb-b", workload="spark-b")], pools, group),
        ],
        now=NOW,
        free_streak=STABLE,
    )
    # spark-a takes B's room for the group; spark-b's replacement goes to C.
    assert [(r.contract, r.pool_id) for r in plan.replace] == [("spark-a", B), ("spark-b", C)]


def test_a_consolidation_the_spread_rules_out_is_held_with_why() -> None:
    # Two mem.xl for a demand of 3: one gp.2xl would cover 3 units in one pool.
    pools = [pool("r1.B.gp.2xl", price=0.128)]
    mem = [inst(f"mem-{x}", "r1.A.mem.xl", price=0.08) for x in "ab"]
    knobs = AntiChurn(stable_rounds=1, consolidation_stable_rounds=1, consolidation_margin=0.1)
    free = view(contract(), mem, pools, [batch(4, A_mem_xl=4)], demand=3)
    (r,) = plan_lifecycle([free], now=NOW, free_streak=STABLE, anti_churn=knobs).replace
    assert (r.reason, r.pool_id, r.replaced) == (CONSOLIDATE, "r1.B.gp.2xl", ("mem-a", "mem-b"))
    tight = free.model_copy(update={"spread": [batch(2, A_mem_xl=4)]})
    plan = plan_lifecycle([tight], now=NOW, free_streak=STABLE, anti_churn=knobs)
    assert plan.replace == [] and plan.consolidable == []
    assert [(h.instance_id, h.reason, h.why) for h in plan.held] == [
        (
            "mem-a",
            CONSOLIDATE,
            "spread: one gp.2xl for mem-a, mem-b would put 3 units of spread group batch "
            "in pool r1.B.gp.2xl (0 there now), spread allows 2 in one pool "
            "(spread_max_pool_fraction 0.25 of the group's 8 units)",
        )
    ]


@pytest.mark.parametrize("spread", [[], [batch(8)]])
def test_room_to_spare_changes_nothing(spread: list[SpreadRoom]) -> None:
    big = fallback(units=4, price=0.352)
    v = view(contract(), [fallback("fb-1"), big], [pool(B, price=0.05), pool(C)], spread)
    plan = plan_lifecycle([v], now=NOW, free_streak=STABLE)
    assert [(r.instance_id, [p.pool_id for p in r.parts]) for r in plan.replace] == [
        ("fb", [B, B]),
        ("fb-1", [B]),
    ]
