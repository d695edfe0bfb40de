"""Why these pools and not the others (planning/choice.py): each of the planner's reasons
to pass a pool over, on small problems whose plan is known, and the bound on the record."""

from __future__ import annotations

import pytest

from planning.choice import ChoiceExplainer, ChoiceRecord, Verdict, explain_choice
from planning.planner import ContractDemand, PlanInput, PoolInput, plan


def _pool(
    pool_id: str,
    price: float,
    *,
    free: int = 50,
    reclaimable: int = 100,
    excluded: bool = False,
    vcpu: int = 8,
    rate: float = 0.0,
) -> PoolInput:
    _, hall, sku, size = pool_id.split(".")
    return PoolInput(
        pool_id=pool_id,
        hall=hall,
        sku=sku,
        size=size,
        vcpu=vcpu,
        memory_gib=4 * vcpu,
        price_per_hour=price,
        reclaimable_units=reclaimable,
        free=free,
        reclaim_rate=rate,
        excluded=excluded,
    )


def _demand(name: str = "ci", units: int = 8, **kw: object) -> ContractDemand:
    base: dict[str, object] = {
        "contract": name,
        "kind": "ci",
        "unit_vcpu": 2,
        "unit_memory_gib": 8,
        "skus": ["cpu"],
        "sizes": ["l"],
        "halls": ["A", "B"],
        "demand_units": units,
        "max_units_per_region": 1000,
        "max_pool_share": 1.0,
    }
    base.update(kw)
    return ContractDemand.model_validate(base)


def _why(inp: PlanInput, contract: str = "ci") -> ChoiceRecord:
    return explain_choice(inp, plan(inp), contract)


def _verdicts(rec: ChoiceRecord) -> dict[str, Verdict]:
    return {c.pool_id: c.verdict for c in rec.chosen + rec.passed_over}


# (name, problem, pool passed over, its verdict, words its reason must say)
CASES = [
    (
        "excluded",
        PlanInput(
            contracts=[_demand()],
            pools=[_pool("r1.A.cpu.l", 0.10, excluded=True), _pool("r1.B.cpu.l", 0.20)],
        ),
        "r1.A.cpu.l",
        Verdict.EXCLUDED,
        "excluded by the pool exclusion cycle",
    ),
    (
        "dearer",
        PlanInput(
            contracts=[_demand()], pools=[_pool("r1.A.cpu.l", 0.10), _pool("r1.B.cpu.l", 0.30)]
        ),
        "r1.B.cpu.l",
        Verdict.DEARER,
        "0.0500/unit-h more than the dearest pool chosen",  # (0.30 - 0.10) / 4 units
    ),
    (
        "dearer by its reclaim risk, at the same price",
        PlanInput(
            contracts=[_demand()],
            pools=[_pool("r1.A.cpu.l", 0.10), _pool("r1.B.cpu.l", 0.10, rate=2.0)],
        ),
        "r1.B.cpu.l",
        Verdict.DEARER,
        "(price 0.1/h, 2 reclaims/instance-h), 0.0250/unit-h more",
    ),
    (
        "not allowed (cheaper sku)",
        PlanInput(
            contracts=[_demand()], pools=[_pool("r1.A.gpu.l", 0.01), _pool("r1.A.cpu.l", 0.10)]
        ),
        "r1.A.gpu.l",
        Verdict.NOT_ALLOWED,
        "sku gpu not in the contract's skus (cpu)",
    ),
    (
        "unit does not fit",
        PlanInput(
            contracts=[_demand()],
            pools=[_pool("r1.A.cpu.l", 0.01, vcpu=1), _pool("r1.B.cpu.l", 0.10)],
        ),
        "r1.A.cpu.l",
        Verdict.UNIT_DOES_NOT_FIT,
        "does not fit",
    ),
    (
        "no free capacity",
        PlanInput(
            contracts=[_demand()],
            pools=[_pool("r1.A.cpu.l", 0.10, free=0), _pool("r1.B.cpu.l", 0.20)],
        ),
        "r1.A.cpu.l",
        Verdict.NO_FREE_CAPACITY,
        "0 instances free",
    ),
    (
        "free capacity taken by another contract",
        PlanInput(
            contracts=[
                _demand(units=8),
                # The other contract may only use A: the planner gives it A's room.
                _demand("etl", units=8, halls=["A"]),
            ],
            pools=[_pool("r1.A.cpu.l", 0.10, free=2), _pool("r1.B.cpu.l", 0.20)],
        ),
        "r1.A.cpu.l",
        Verdict.NO_FREE_CAPACITY,
        "gave its 2 free instances to etl",
    ),
    (
        "pool share cap",
        PlanInput(
            contracts=[_demand(max_pool_share=0.1, existing={"r1.A.cpu.l": 1})],
            pools=[_pool("r1.A.cpu.l", 0.10, reclaimable=10), _pool("r1.B.cpu.l", 0.20)],
        ),
        "r1.A.cpu.l",
        Verdict.POOL_SHARE_CAP,
        "max_pool_share 0.1 of 10 instances allows 1; the contract holds 1",
    ),
    (
        "spread cap",
        PlanInput(
            contracts=[_demand(units=8, spread_groups=["g"], existing={"r1.A.cpu.l": 1})],
            pools=[_pool("r1.A.cpu.l", 0.10), _pool("r1.B.cpu.l", 0.20)],
            spread_max_pool_fraction=0.5,
        ),
        "r1.A.cpu.l",
        Verdict.SPREAD_CAP,
        "spread group g holds 4 of the 4 units",
    ),
]


@pytest.mark.parametrize(
    ("problem", "pool_id", "verdict", "words"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_each_reason_to_pass_a_pool_over(
    problem: PlanInput, pool_id: str, verdict: Verdict, words: str
) -> None:
    rec = _why(problem)
    assert rec.basis == "planner" and rec.chosen, rec
    passed = {c.pool_id: c for c in rec.passed_over}
    assert passed[pool_id].verdict is verdict, passed[pool_id]
    said = passed[pool_id].why + " | " + " | ".join(c.why for c in rec.chosen)
    assert words in said, said


def test_chosen_pools_carry_cost_rank_and_what_filled_them() -> None:
    # A is cheapest but holds 2 free instances (8 units): the plan fills it, then B.
    inp = PlanInput(
        contracts=[_demand(units=12)],
        pools=[
            _pool("r1.A.cpu.l", 0.10, free=2),
            _pool("r1.B.cpu.l", 0.20),
            _pool("r1.B.cpu.xl", 0.05),  # size not allowed, cheaper: named
            _pool("r1.C.cpu.l", 0.01),  # hall not allowed, cheaper: named
            _pool("r1.A.mem.xl", 9.0),  # not allowed and dearer: not worth a line
        ],
    )
    rec = _why(inp)
    chosen = {c.pool_id: c for c in rec.chosen}
    assert set(chosen) == {"r1.A.cpu.l", "r1.B.cpu.l"}
    a, b = chosen["r1.A.cpu.l"], chosen["r1.B.cpu.l"]
    assert (a.rank, b.rank, rec.ranked) == (1, 2, 2)
    assert (a.instances, a.units, b.units) == (2, 8, 4)
    assert a.cost_per_unit_hour == pytest.approx(0.025)
    assert "rank 1 of 2" in a.why and "then full: no free capacity left" in a.why
    assert [c.pool_id for c in rec.passed_over] == ["r1.C.cpu.l", "r1.B.cpu.xl"]
    assert "hall C not in the contract's halls (A, B)" in rec.passed_over[0].why
    assert "size xl not in the contract's sizes (l)" in rec.passed_over[1].why


def test_risk_makes_a_same_price_pool_dearer_per_unit() -> None:
    inp = PlanInput(
        contracts=[_demand()],
        pools=[_pool("r1.A.cpu.l", 0.10), _pool("r1.B.cpu.l", 0.10, rate=2.0)],
    )
    rec = _why(inp)
    b = rec.passed_over[0]
    assert b.verdict is Verdict.DEARER
    # CI loses 0.5 h per reclaim: 0.10 * (1 + 2 * 0.5) / 4 units = 0.05 against 0.025.
    assert b.cost_per_unit_hour == pytest.approx(0.05)
    assert b.dearer_by == pytest.approx(0.025)
    assert "0 reclaims/instance-h" in rec.chosen[0].why


def test_an_excluded_pool_that_is_also_dearer_says_both() -> None:
    inp = PlanInput(
        contracts=[_demand()],
        pools=[_pool("r1.A.cpu.l", 0.10), _pool("r1.B.cpu.l", 0.30, excluded=True)],
    )
    b = _why(inp).passed_over[0]
    assert b.verdict is Verdict.EXCLUDED and b.dearer_by == pytest.approx(0.05)
    assert "and dearer by 0.0500/unit-h" in b.why


def test_the_record_is_bounded_to_the_most_telling_pools() -> None:
    pools = [_pool("r1.A.cpu.l", 0.10)]
    pools += [_pool(f"r1.B{i:02d}.cpu.l", 0.20 + i / 100) for i in range(20)]
    pools += [_pool("r1.A.cpu.xl", 0.05)]  # not allowed, cheaper: after the usable ones
    inp = PlanInput(
        contracts=[_demand(halls=["A"] + [f"B{i:02d}" for i in range(20)])], pools=pools
    )
    rec = explain_choice(inp, plan(inp), "ci", limit=8)
    assert len(rec.passed_over) == 8 and rec.left_off == 13
    assert [c.pool_id for c in rec.passed_over[:2]] == ["r1.B00.cpu.l", "r1.B01.cpu.l"]
    assert all(c.verdict is Verdict.DEARER for c in rec.passed_over)
    assert len(rec.model_dump_json()) < 4000


def test_nothing_chosen_says_why_each_usable_pool_was_left() -> None:
    # Every allowed pool excluded or full: a fallback-only acquisition still says why.
    inp = PlanInput(
        contracts=[_demand()],
        pools=[_pool("r1.A.cpu.l", 0.10, excluded=True), _pool("r1.B.cpu.l", 0.20, free=0)],
    )
    rec = _why(inp)
    assert rec.chosen == []
    assert _verdicts(rec) == {
        "r1.A.cpu.l": Verdict.EXCLUDED,
        "r1.B.cpu.l": Verdict.NO_FREE_CAPACITY,
    }


def test_same_input_same_record_whatever_the_order() -> None:
    pools = [_pool("r1.A.cpu.l", 0.10, free=1), _pool("r1.B.cpu.l", 0.2), _pool("r1.A.gpu.l", 0.01)]
    a = PlanInput(contracts=[_demand(), _demand("etl", halls=["A"])], pools=pools)
    b = PlanInput(contracts=a.contracts[::-1], pools=pools[::-1])
    assert _why(a) == _why(b)
    assert ChoiceRecord.model_validate_json(_why(a).model_dump_json()) == _why(a)


def test_unknown_contract_is_a_key_error() -> None:
    inp = PlanInput(contracts=[_demand()], pools=[_pool("r1.A.cpu.l", 0.1)])
    with pytest.raises(KeyError):
        explain_choice(inp, plan(inp), "nope")


def test_an_acquisition_keeps_only_the_chosen_pools_it_launches_in() -> None:
    # The controller splits a plan over acquisitions (max_instances_per_acquisition): each
    # records its own chosen pools, the rest counted, the same pools passed over.
    inp = PlanInput(
        contracts=[_demand(units=12)],
        pools=[
            _pool("r1.A.cpu.l", 0.10, free=2),
            _pool("r1.B.cpu.l", 0.20),
            _pool("r1.C.cpu.l", 1),
        ],
        # hall C is not allowed: nothing; B is dearer than A but chosen too
    )
    why = ChoiceExplainer(inp, plan(inp))
    first = why.for_acquisition("ci", {"r1.A.cpu.l"})
    second = why.for_acquisition("ci", {"r1.B.cpu.l"})
    assert [c.pool_id for c in first.chosen] == ["r1.A.cpu.l"] and first.chosen_elsewhere == 1
    assert [c.pool_id for c in second.chosen] == ["r1.B.cpu.l"] and second.chosen_elsewhere == 1
    assert first.passed_over == second.passed_over == why.record("ci").passed_over
    assert why.record("ci") is why.record("ci")  # computed once per contract
