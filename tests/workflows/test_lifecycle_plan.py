"""planning/lifecycle.py: which instances the lifecycle workflow replaces, where, and when
it holds back (budget, blackout, anti-churn, no room)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from contracts.disruption import DisruptionReason
from contracts.model import Contract
from planning.lifecycle import (
    AntiChurn,
    ContractLife,
    LifeInstance,
    LifePool,
    next_consolidation_streak,
    next_streak,
    plan_lifecycle,
)
from tests.support.contract_fixtures import example

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)  # a Wednesday
REPLACE = DisruptionReason.RETURN_FROM_FALLBACK


def contract(disruption: dict[str, Any] | None = None, **placement: Any) -> Contract:
    doc = example("spark-etl")  # gp/mem, xl/2xl, halls A-D, unit 4 vCPU / 16 GiB
    doc["placement"].update(placement)
    if disruption is not None:
        doc["disruption"] = disruption
    return Contract.model_validate(doc, strict=False)


def inst(
    iid: str,
    *,
    sku: str = "gp",
    age_hours: float = 5.0,
    fallback: bool = False,
    price: float = 0.064,
    state: str = "active",
) -> LifeInstance:
    return LifeInstance(
        instance_id=iid,
        region="r1",
        workload="spark-etl",
        pool_id=f"r1.A.{sku}.xl",
        hall="A",
        sku=sku,
        size="xl",
        state=state,
        committed=fallback,
        fallback=fallback,
        created_at=NOW - timedelta(hours=age_hours),
        price_per_hour=0.176 if fallback else price,
        units=2,
    )


def pool(pid: str = "r1.B.gp.xl", free: int = 5, price: float = 0.064) -> LifePool:
    return LifePool(
        pool_id=pid,
        hall=pid.split(".")[1],
        flavor="gp.xl",
        price_per_hour=price,
        units=2,
        free=free,
    )


def view(
    c: Contract, instances: list[LifeInstance], pools: list[LifePool] | None = None
) -> ContractLife:
    return ContractLife(contract=c, tier=2, instances=instances, pools=pools or [pool()])


STABLE = {"r1.B.gp.xl": 2, "r1.C.gp.xl": 2}


def test_a_budget_of_one_replaces_one_at_a_time_cheapest_pool_first() -> None:
    v = view(
        contract({"budgets": [{"max_instances": 1}]}),
        [inst("fb-1", fallback=True), inst("fb-2", fallback=True, age_hours=9), inst("ok")],
        [pool("r1.B.gp.xl", price=0.07), pool("r1.C.gp.xl", price=0.064)],
    )
    plan = plan_lifecycle([v], now=NOW, free_streak=STABLE)
    assert [(r.instance_id, r.reason, r.pool_id) for r in plan.replace] == [
        ("fb-2", REPLACE, "r1.C.gp.xl")  # the oldest fallback, into the cheapest pool
    ]
    assert plan.replace[0].saving_per_hour > 0.1
    assert [(h.instance_id, h.why) for h in plan.held] == [
        ("fb-1", "budget 0 (1 instances) has 1 in flight")
    ]
    # One already under way: nothing more starts.
    busy = plan_lifecycle([v], now=NOW, free_streak=STABLE, in_flight={"spark-etl": {REPLACE: 1}})
    assert busy.replace == [] and len(busy.held) == 2


def test_drift_goes_first_and_shares_the_budget() -> None:
    c = contract({"budgets": [{"max_instances": 1}]}, skus=["gp"])  # mem no longer allowed
    v = view(c, [inst("fb", fallback=True), inst("mem-1", sku="mem")])
    plan = plan_lifecycle([v], now=NOW, free_streak=STABLE)
    assert [(r.instance_id, r.reason) for r in plan.replace] == [("mem-1", DisruptionReason.DRIFT)]
    assert "sku mem no longer allowed" in plan.replace[0].why
    assert [h.instance_id for h in plan.held] == ["fb"]


def test_a_blackout_holds_every_voluntary_reason() -> None:
    c = contract(
        {
            "blackouts": [{"schedule": "0 11 * * 3", "duration_minutes": 120}],
            "max_instance_age_hours": 1,
        },
        skus=["gp"],
    )
    v = view(c, [inst("fb", fallback=True), inst("mem", sku="mem"), inst("old", age_hours=50)])
    plan = plan_lifecycle([v], now=NOW, free_streak=STABLE)
    assert plan.replace == []
    assert {(h.instance_id, h.reason, h.why) for h in plan.held} == {
        ("mem", DisruptionReason.DRIFT, "blackout 0 is open"),
        ("fb", REPLACE, "blackout 0 is open"),
        ("old", DisruptionReason.EXPIRY, "blackout 0 is open"),
    }
    # The window closed: the same plan goes ahead (default budget: 10 % of 3 = 1).
    later = plan_lifecycle([v], now=NOW + timedelta(hours=3), free_streak=STABLE)
    assert [r.instance_id for r in later.replace] == ["mem"]


def test_anti_churn_min_age_and_hysteresis() -> None:
    c = contract({"budgets": [{"max_instances": 5}]})
    young = view(c, [inst("fb", fallback=True, age_hours=0.5)])
    plan = plan_lifecycle([young], now=NOW, free_streak=STABLE)
    assert plan.replace == [] and "under min_age_seconds 3600" in plan.held[0].why

    # Free capacity seen on one round only: not chased yet; on the second round it is.
    old = view(c, [inst("fb", fallback=True)])
    streak = next_streak({}, [old])
    assert streak == {"r1.B.gp.xl": 1}
    first = plan_lifecycle([old], now=NOW, free_streak=streak)
    assert first.replace == []
    assert (
        first.held[0].why
        == "free capacity in r1.B.gp.xl seen on 1 of 2 rounds in a row (hysteresis)"
    )
    streak = next_streak(streak, [old])
    assert [r.instance_id for r in plan_lifecycle([old], now=NOW, free_streak=streak).replace] == [
        "fb"
    ]
    # The pool flickers full: its run starts again.
    full = view(c, [inst("fb", fallback=True)], [pool(free=0)])
    assert next_streak(streak, [full]) == {}

    # A saving under the threshold is no reason to move.
    knobs = AntiChurn(min_saving_per_hour=0.5)
    held = plan_lifecycle([old], now=NOW, free_streak=STABLE, anti_churn=knobs)
    assert held.replace == [] and "under min_saving_per_hour 0.5" in held.held[0].why


def test_make_before_break_needs_room_and_enough_units() -> None:
    c = contract({"budgets": [{"max_instances": 5}]})
    small = pool("r1.B.gp.xl", free=1).model_copy(update={"units": 1})  # one is not enough
    excluded = pool("r1.C.gp.xl").model_copy(update={"excluded": True})
    v = view(c, [inst("fb", fallback=True)], [small, excluded, pool("r1.D.gp.xl", free=0)])
    plan = plan_lifecycle([v], now=NOW, free_streak={**STABLE, "r1.D.gp.xl": 3})
    assert plan.replace == [] and "no allowed reclaimable pool" in plan.held[0].why
    # Two fallbacks, room for one: the second waits, never breaks without a replacement.
    v = view(c, [inst("fb-1", fallback=True), inst("fb-2", fallback=True)], [pool(free=1)])
    plan = plan_lifecycle([v], now=NOW, free_streak=STABLE)
    assert len(plan.replace) == 1 and len(plan.held) == 1


# -- return from fallback in smaller pieces ------------------------------------------------


def big_fallback(iid: str = "fb", age_hours: float = 5.0) -> LifeInstance:
    """A committed gp.2xl fallback (4 units, 0.352/h)."""
    return inst(iid, fallback=True, age_hours=age_hours).model_copy(
        update={"pool_id": "r1.A.gp.2xl", "size": "2xl", "units": 4, "price_per_hour": 0.352}
    )


def test_a_fallback_returns_as_several_smaller_instances_when_no_large_one_is_free() -> None:
    c = contract({"budgets": [{"max_instances": 1}]})
    big = pool("r1.B.gp.2xl", free=0, price=0.128).model_copy(
        update={"units": 4, "flavor": "gp.2xl"}
    )
    xl_b, xl_c = pool("r1.B.gp.xl", free=1, price=0.064), pool("r1.C.gp.xl", price=0.07)
    v = view(c, [big_fallback(), big_fallback("fb-2", age_hours=3)], [big, xl_b, xl_c])
    plan = plan_lifecycle([v], now=NOW, free_streak=STABLE)
    (r,) = plan.replace  # a budget of 1: one fallback (one disruption) at a time
    assert (r.instance_id, r.reason) == ("fb", REPLACE)
    # The cheapest pair: B's one free xl, then C's.
    assert [(p.pool_id, p.units) for p in r.parts] == [("r1.B.gp.xl", 2), ("r1.C.gp.xl", 2)]
    assert r.new_units == 4 and r.new_price_per_hour == pytest.approx(0.134)
    assert r.parts[0].price_per_hour == pytest.approx(0.064)
    assert r.saving_per_hour == pytest.approx(0.352 - 0.134)
    assert "as 2 smaller instances (gp.xl in r1.B.gp.xl + gp.xl in r1.C.gp.xl)" in r.why
    assert [(h.instance_id, h.why) for h in plan.held] == [
        ("fb-2", "budget 0 (1 instances) has 1 in flight")
    ]
    # One large instance free: it is preferred to the pieces (one launch, one drain).
    free_big = big.model_copy(update={"free": 1})
    plan = plan_lifecycle(
        [view(c, [big_fallback()], [free_big, xl_b, xl_c])],
        now=NOW,
        free_streak={**STABLE, "r1.B.gp.2xl": 2},
    )
    assert [(p.pool_id, p.units) for p in plan.replace[0].parts] == [("r1.B.gp.2xl", 4)]
    assert plan.replace[0].more == ()


def test_the_pieces_respect_room_share_hysteresis_saving_and_a_part_limit() -> None:
    c = contract({"budgets": [{"max_instances": 5}]})
    one = pool("r1.B.gp.xl", free=1)
    # Room for one xl only: 2 of 4 units, held (never broken without all its replacement).
    plan = plan_lifecycle([view(c, [big_fallback()], [one])], now=NOW, free_streak=STABLE)
    assert (
        plan.replace == []
        and plan.held[0].why == "no allowed reclaimable pool has room for 4 unit(s)"
    )
    # The pool share caps the pieces too.
    capped = pool("r1.B.gp.xl").model_copy(update={"share_cap": 1})
    plan = plan_lifecycle([view(c, [big_fallback()], [capped])], now=NOW, free_streak=STABLE)
    assert plan.replace == []
    # Free on one round only: every piece waits for its pool's hysteresis.
    two = [pool("r1.B.gp.xl", free=1), pool("r1.C.gp.xl", free=1)]
    first = plan_lifecycle(
        [view(c, [big_fallback()], two)], now=NOW, free_streak={"r1.B.gp.xl": 2, "r1.C.gp.xl": 1}
    )
    assert first.replace == []
    assert first.held[0].why == (
        "free capacity in r1.B.gp.xl, r1.C.gp.xl seen on 1 of 2 rounds in a row (hysteresis)"
    )
    # Pieces that cost as much as the fallback save nothing: held.
    dear = [p.model_copy(update={"price_per_hour": 0.2}) for p in two]
    held = plan_lifecycle([view(c, [big_fallback()], dear)], now=NOW, free_streak=STABLE)
    assert held.replace == [] and held.held[0].why.startswith("saves -0.048/h")
    # Four 1-unit pieces exceed a limit of 3 parts; one for one only when the limit is 1.
    tiny = [pool("r1.B.gp.xl").model_copy(update={"units": 1})]
    for limit, n in ((4, 4), (3, 0), (1, 0)):
        plan = plan_lifecycle(
            [view(c, [big_fallback()], tiny)],
            now=NOW,
            free_streak=STABLE,
            anti_churn=AntiChurn(max_return_parts=limit),
        )
        assert [len(r.parts) for r in plan.replace] == ([n] if n else []), limit
    # Drift and expiry are still one for one: pieces are for fallback only.
    drifted = contract({"budgets": [{"max_instances": 5}]}, skus=["gp"])
    mem = big_fallback("mem").model_copy(
        update={"sku": "mem", "fallback": False, "committed": False}
    )
    plan = plan_lifecycle([view(drifted, [mem], [pool()])], now=NOW, free_streak=STABLE)
    assert plan.replace == [] and "room for 4 unit(s)" in plan.held[0].why


def test_two_fallbacks_share_the_free_pieces() -> None:
    c = contract({"budgets": [{"max_instances": 5}]})
    three = pool("r1.B.gp.xl", free=3)
    fbs = [big_fallback("fb-1", age_hours=9), big_fallback("fb-2")]
    plan = plan_lifecycle([view(c, fbs, [three])], now=NOW, free_streak=STABLE)
    # Three free xl: two for the older fallback, one left is not enough for the other.
    assert [(r.instance_id, len(r.parts)) for r in plan.replace] == [("fb-1", 2)]
    assert [h.instance_id for h in plan.held] == ["fb-2"]


def test_replacements_stay_within_the_contracts_pool_share() -> None:
    c = contract({"budgets": [{"max_instances": 5}]})
    capped = pool("r1.B.gp.xl", price=0.05).model_copy(update={"share_cap": 2})
    others = pool("r1.C.gp.xl", price=0.064)
    held_there = inst("ok").model_copy(update={"pool_id": "r1.B.gp.xl", "hall": "B"})
    fbs = [inst(f"fb-{n}", fallback=True, age_hours=9 - n) for n in range(3)]
    plan = plan_lifecycle(
        [view(c, [held_there, *fbs], [capped, others])], now=NOW, free_streak=STABLE
    )
    # One more fits under B's cap of 2 (one is there already); the others go to C.
    assert [(r.instance_id, r.pool_id) for r in plan.replace] == [
        ("fb-0", "r1.B.gp.xl"),
        ("fb-1", "r1.C.gp.xl"),
        ("fb-2", "r1.C.gp.xl"),
    ]


def test_paused_contracts_and_leaving_or_booting_instances_are_left_alone() -> None:
    c = contract({"budgets": [{"max_instances": 5}]})
    v = view(
        c,
        [
            inst("fb", fallback=True),
            inst("gone", fallback=True, state="draining"),
            inst("booting", sku="mem", state="requested"),  # drifted, but no node to drain yet
        ],
    )
    plan = plan_lifecycle([v], now=NOW, free_streak=STABLE, paused={"spark-etl"})
    assert plan.replace == [] and [(h.instance_id, h.why) for h in plan.held] == [("fb", "paused")]
    c = contract({"budgets": [{"max_instances": 5}]}, skus=["gp"])
    plan = plan_lifecycle([view(c, v.instances)], now=NOW, free_streak=STABLE)
    assert [r.instance_id for r in plan.replace] == ["fb"]


# -- consolidation -----------------------------------------------------------------------


def half_empty(demand: int = 3, **knobs: Any) -> tuple[ContractLife, AntiChurn]:
    """Two mem.xl (2 units, 0.08/h each) for a demand of 3 units: gp.2xl holds 4 for 0.128/h."""
    c = contract({"budgets": [{"max_instances": 1}]})
    mem = [inst(f"mem-{x}", sku="mem", price=0.08) for x in "ab"]
    pools = [
        pool("r1.B.gp.xl", price=0.064),
        pool("r1.B.gp.2xl", price=0.128).model_copy(update={"units": 4, "flavor": "gp.2xl"}),
    ]
    v = view(c, mem, pools).model_copy(update={"demand_units": demand})
    # Two rounds and a 10 % margin (the defaults are 12 and 20 %: decision 0039), so that
    # each step is a round of its own here.
    return v, AntiChurn(**{"consolidation_stable_rounds": 2, "consolidation_margin": 0.1, **knobs})


CONSOLIDATE = DisruptionReason.CONSOLIDATION
POOLS_STABLE = {"r1.B.gp.xl": 2, "r1.B.gp.2xl": 2}


def test_by_default_a_consolidation_waits_an_hour_of_rounds_and_a_fifth_saved() -> None:
    """Decision 0039: a consolidation answers a dip in demand, which mostly comes back; it
    waits 12 rounds (an hour) and must save 20 % of what it replaces."""
    v, _ = half_empty()
    streak: dict[str, int] = {}
    for n in range(1, 12):
        plan = plan_lifecycle([v], now=NOW, free_streak=POOLS_STABLE, consolidation_streak=streak)
        assert plan.replace == [], n
        assert plan.held[0].why == f"found on {n} of 12 rounds in a row (hysteresis)"
        streak = next_consolidation_streak(streak, plan)
    plan = plan_lifecycle([v], now=NOW, free_streak=POOLS_STABLE, consolidation_streak=streak)
    (r,) = plan.replace
    assert r.saving_per_hour == pytest.approx(0.032)  # 20 % of 0.16/h: just enough
    cheaper = v.model_copy(
        update={"pools": [p.model_copy(update={"price_per_hour": 0.1281}) for p in v.pools]}
    )
    plan = plan_lifecycle([cheaper], now=NOW, free_streak=POOLS_STABLE, consolidation_streak=streak)
    assert plan.replace == []  # saves 19.9 %


def test_two_half_empty_instances_become_one_after_two_rounds_within_a_budget_of_one() -> None:
    v, knobs = half_empty()
    first = plan_lifecycle([v], now=NOW, free_streak=POOLS_STABLE, anti_churn=knobs)
    assert first.replace == [] and first.consolidable == ["spark-etl"]
    assert first.held[0].why == "found on 1 of 2 rounds in a row (hysteresis)"
    streak = next_consolidation_streak({}, first)
    second = plan_lifecycle(
        [v], now=NOW, free_streak=POOLS_STABLE, anti_churn=knobs, consolidation_streak=streak
    )
    (r,) = second.replace
    assert (r.reason, r.replaced, r.pool_id, r.units) == (
        CONSOLIDATE,
        ("mem-a", "mem-b"),
        "r1.B.gp.2xl",
        4,
    )
    assert r.saving_per_hour == pytest.approx(0.032)
    assert "still covers demand 3" in r.why
    # A drift of the same contract goes first and takes the budget of 1.
    drifted = v.model_copy(
        update={"contract": contract({"budgets": [{"max_instances": 1}]}, skus=["gp"])}
    )
    both = plan_lifecycle(
        [drifted.model_copy(update={"instances": [*v.instances, inst("gone", sku="mem")]})],
        now=NOW,
        free_streak=POOLS_STABLE,
        anti_churn=knobs,
        consolidation_streak=streak,
    )
    assert [x.reason for x in both.replace] == [DisruptionReason.DRIFT]


def consolidable(v: ContractLife, **options: Any) -> list[str]:
    options.setdefault("free_streak", POOLS_STABLE)
    return plan_lifecycle([v], now=NOW, **options).consolidable


def test_consolidation_is_no_plain_release_and_needs_a_margin_and_age() -> None:
    # Demand 2: either instance can simply go (the controller's surplus release).
    v, _ = half_empty(demand=2)
    assert consolidable(v, consolidation_streak={"spark-etl": 5}) == []
    for knobs in (
        {"consolidation_margin": 0.5},  # saves 20 %, wants 50 %
        {"min_saving_per_hour": 0.05},
        {"min_age_seconds": 24 * 3600},  # 5 h old
        {"consolidate": False},
    ):
        v, churn = half_empty(**knobs)
        assert consolidable(v, anti_churn=churn) == [], knobs
    # Unknown demand: never.
    v, _ = half_empty()
    assert consolidable(v.model_copy(update={"demand_units": None})) == []
    # A target pool that only just showed free capacity is not chased either.
    assert consolidable(v, free_streak={"r1.B.gp.2xl": 1}) == []


def test_a_hall_where_no_drain_could_be_told_waits() -> None:
    c = contract({"budgets": [{"max_instances": 5}]})
    v = view(c, [inst("fb", fallback=True)])
    plan = plan_lifecycle([v], now=NOW, free_streak=STABLE, undrainable={"A"})
    assert plan.replace == []
    assert plan.held[0].why == "no drain can be told in hall A lately (no relay answered)"
    # Consolidation leaves the hall's instances alone too.
    half, _ = half_empty()
    streak = {"spark-etl": 5}
    assert consolidable(half, consolidation_streak=streak, undrainable={"A"}) == []
    assert consolidable(half, consolidation_streak=streak) == ["spark-etl"]
