"""The portfolio planner: hard constraints on random inputs, against an exact MILP, and on
the real r1 region with the example contracts.

The constraint checks below are written from the planner's specification, not from its
code; only the cap rounding (planning.costs) is shared, because it *is* the
specification of the caps.
"""

from __future__ import annotations

import math
import os
import random
import statistics
from collections import defaultdict

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.feasibility import units_per_instance as contract_units_per_instance
from contracts.model import Contract, UnitShape
from contracts.region import load_region
from planning.costs import pool_share_cap, spread_cap
from planning.planner import (
    ContractDemand,
    Plan,
    PlanInput,
    PoolInput,
    contract_demand,
    plan,
    pool_input,
    risk_cost,
    units_per_instance,
)
from tests.support.fuzz import examples
from tests.support.paths import REPO
from tests.support.planner_reference import (
    KINDS,
    SHAPES,
    UNITS,
    check_no_easy_shortfall,
    check_plan,
    contended_instance,
    gap_pct,
    milp_reference,
    usable,
)

R1 = REPO / "deploy" / "regions" / "r1.toml"
EXAMPLES = REPO / "contracts" / "examples"

# --- the specification, as checks -------------------------------------------------------


# --- random inputs ----------------------------------------------------------------------


@st.composite
def plan_inputs(draw: st.DrawFn) -> PlanInput:
    halls = draw(st.lists(st.sampled_from("ABCD"), min_size=1, max_size=3, unique=True))
    combos = [(h, s, z) for h in halls for s in SHAPES for z in ("l", "xl")]
    chosen = draw(st.lists(st.sampled_from(combos), min_size=4, max_size=20, unique=True))
    pools = []
    for hall, sku, size in sorted(chosen):
        v, m, g = SHAPES[sku]
        mult = 1 if size == "l" else 2
        reclaimable = draw(st.integers(0, 30))
        pools.append(
            PoolInput(
                pool_id=f"r1.{hall}.{sku}.{size}",
                hall=hall,
                sku=sku,
                size=size,
                vcpu=v * mult,
                memory_gib=m * mult,
                gpus=g * mult,
                price_per_hour=draw(st.floats(0.01, 3.0)),
                reclaimable_units=reclaimable,
                free=draw(st.integers(0, reclaimable)),
                reclaim_rate=draw(st.sampled_from([0.0, 0.05, 0.5, 2.0])),
                excluded=draw(st.booleans()) and draw(st.booleans()),
            )
        )
    pool_ids = [p.pool_id for p in pools]
    contracts = []
    for i in range(draw(st.integers(2, 6))):
        uv, um, ug = draw(st.sampled_from(UNITS))
        demand = draw(st.integers(0, 80))
        existing = draw(st.dictionaries(st.sampled_from(pool_ids), st.integers(0, 4), max_size=3))
        contracts.append(
            ContractDemand(
                contract=f"c{i}",
                kind=draw(st.sampled_from(KINDS)),
                unit_vcpu=uv,
                unit_memory_gib=um,
                unit_gpus=ug,
                skus=draw(st.lists(st.sampled_from(sorted(SHAPES)), min_size=1, unique=True)),
                sizes=draw(st.lists(st.sampled_from(["l", "xl"]), min_size=1, unique=True)),
                halls=draw(st.lists(st.sampled_from(halls), min_size=1, unique=True)),
                demand_units=demand,
                max_units_per_region=draw(st.integers(0, 100)),
                max_pool_share=draw(st.sampled_from([0.1, 0.25, 0.5, 1.0])),
                spread_groups=draw(st.lists(st.sampled_from(["g1", "g2"]), unique=True)),
                existing=existing,
            )
        )
    fraction = draw(st.sampled_from([0.1, 0.25, 0.5, 1.0]))
    return PlanInput(contracts=contracts, pools=pools, spread_max_pool_fraction=fraction)


# PLANNER_EXAMPLES=3000 for a longer hunt than the suite's.
PROPERTY_SETTINGS = settings(
    max_examples=int(os.environ.get("PLANNER_EXAMPLES", str(examples(150)))),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@PROPERTY_SETTINGS
@given(plan_inputs())
def test_every_hard_constraint_holds(inp: PlanInput) -> None:
    out = plan(inp)
    check_plan(inp, out)
    check_no_easy_shortfall(inp, out)


@PROPERTY_SETTINGS
@given(plan_inputs())
def test_excluded_and_unusable_pools_get_nothing(inp: PlanInput) -> None:
    out = plan(inp)
    pools = {p.pool_id: p for p in inp.pools}
    demands = {c.contract: c for c in inp.contracts}
    for a in out.allocations:
        assert not pools[a.pool_id].excluded
        assert usable(demands[a.contract], pools[a.pool_id])


@PROPERTY_SETTINGS
@given(plan_inputs())
def test_deterministic_and_independent_of_input_order(inp: PlanInput) -> None:
    first = plan(inp)
    assert plan(inp) == first
    reordered = PlanInput(
        contracts=list(reversed(inp.contracts)),
        pools=list(reversed(inp.pools)),
        spread_max_pool_fraction=inp.spread_max_pool_fraction,
    )
    assert plan(reordered) == first


# --- exact reference --------------------------------------------------------------------


def test_against_the_exact_milp_optimum() -> None:
    gaps = []
    for seed in range(30):
        inp = contended_instance(seed)
        out = plan(inp)
        check_plan(inp, out)
        least, cheapest = milp_reference(inp)
        assert sum(o.shortfall_units for o in out.outcomes) == least, f"seed {seed}"
        gaps.append(gap_pct(out.cost_per_hour, cheapest))
    mean, worst = statistics.fmean(gaps), max(gaps)
    print(f"\nplanner vs MILP on 30 instances: mean gap {mean:.3f} %, max gap {worst:.3f} %")
    assert min(gaps) >= -1e-6  # never below the optimum: that would be a broken constraint
    assert mean <= 1.0
    assert worst <= 3.0


# --- the real region and the example contracts -----------------------------------------


def example_contracts() -> list[Contract]:
    return [
        Contract.model_validate(yaml.safe_load(path.read_text()), strict=False)
        for path in sorted(EXAMPLES.glob("*.yaml"))
    ]


def r1_input(existing: dict[str, dict[str, int]] | None = None) -> PlanInput:
    region = load_region(R1)
    rates = random.Random(1)
    pools = [
        pool_input(
            region,
            p,
            free=p.reclaimable_units,
            reclaim_rate=rates.choice([0.0, 0.05, 0.3]),
            excluded=region.pool_id(p) == "r1.A.cpu.l",
        )
        for p in region.pools
    ]
    contracts = [
        contract_demand(
            c, "r1", c.placement.max_units_per_region + 50, (existing or {}).get(c.name)
        )
        for c in example_contracts()
    ]
    return PlanInput(contracts=contracts, pools=pools)


def test_r1_with_the_example_contracts() -> None:
    inp = r1_input()
    assert len(inp.pools) == 144
    out = plan(inp)
    check_plan(inp, out)
    for o in out.outcomes:
        assert o.shortfall_units == 0, o
        assert o.planned_units == o.target_units  # demand is above every cap
    assert not any(a.pool_id == "r1.A.cpu.l" for a in out.allocations)

    # Fed back as what the contracts hold (and no longer free), the plan asks for nothing.
    held: dict[str, dict[str, int]] = defaultdict(dict)
    for a in out.allocations:
        held[a.contract][a.pool_id] = a.instances
    launched = {p: sum(a.instances for a in out.allocations if a.pool_id == p) for p in held}
    again = r1_input(held)
    again = again.model_copy(
        update={
            "pools": [
                p.model_copy(update={"free": p.free - launched.get(p.pool_id, 0)})
                for p in again.pools
            ]
        }
    )
    second = plan(again)
    assert second.allocations == []
    for o in second.outcomes:
        assert o.held_units >= o.target_units and o.shortfall_units == 0


def test_r1_units_per_instance_match_the_contract_layer() -> None:
    region = load_region(R1)
    for contract in example_contracts():
        demand = contract_demand(contract, "r1", 1)
        for pool in region.pools:
            expected = contract_units_per_instance(contract.unit, pool)
            assert units_per_instance(demand, pool_input(region, pool, free=0)) == expected


def test_risk_cost_adds_the_expected_restart_work() -> None:
    region = load_region(R1)
    pool = pool_input(region, region.pools[0], free=1, reclaim_rate=0.2)
    assert risk_cost(pool, "training") == pytest.approx(pool.price_per_hour * 1.2)
    assert risk_cost(pool, "service") == pytest.approx(pool.price_per_hour * 1.02)
    steady = pool.model_copy(update={"reclaim_rate": 0.0})
    assert risk_cost(steady, "ci") == steady.price_per_hour


def test_flaky_pool_goes_to_the_workload_that_loses_least() -> None:
    """Two pools of one shape: the flaky one is cheaper for a service replica (0.9 x 1.05),
    dearer for training (0.9 x 1.5); with room for one contract each, each gets the pool
    that suits it."""

    def pool(hall: str, price: float, rate: float) -> PoolInput:
        return PoolInput(
            pool_id=f"r1.{hall}.gp.l",
            hall=hall,
            sku="gp",
            size="l",
            vcpu=4,
            memory_gib=16,
            price_per_hour=price,
            reclaimable_units=10,
            free=10,
            reclaim_rate=rate,
        )

    def demand(name: str, kind: str) -> ContractDemand:
        return ContractDemand(
            contract=name,
            kind=kind,
            unit_vcpu=4,
            unit_memory_gib=16,
            skus=["gp"],
            sizes=["l"],
            halls=["A", "B"],
            demand_units=10,
            max_units_per_region=10,
            max_pool_share=1.0,
        )

    inp = PlanInput(
        contracts=[demand("replicas", "service"), demand("trainer", "training")],
        pools=[pool("A", 1.0, 0.0), pool("B", 0.9, 0.5)],
    )
    out = plan(inp)
    check_plan(inp, out)
    assert {(a.contract, a.pool_id) for a in out.allocations} == {
        ("replicas", "r1.B.gp.l"),
        ("trainer", "r1.A.gp.l"),
    }


def test_inputs_are_checked() -> None:
    inp = r1_input()
    with pytest.raises(ValueError, match="unknown pool"):
        plan(
            inp.model_copy(
                update={
                    "contracts": [
                        inp.contracts[0].model_copy(update={"existing": {"r9.Z.gp.l": 1}})
                    ]
                }
            )
        )
    with pytest.raises(ValueError, match="duplicate pool_id"):
        plan(inp.model_copy(update={"pools": [*inp.pools, inp.pools[0]]}))
    with pytest.raises(ValueError, match="unknown workload kind"):
        ContractDemand.model_validate({**inp.contracts[0].model_dump(), "kind": "batch"})


def test_a_contract_not_in_the_region_gets_nothing_and_releases_what_it_holds() -> None:
    spark = next(c for c in example_contracts() if c.name == "spark-etl")
    assert "r3" not in spark.regions
    demand = contract_demand(spark, "r3", 100, {"r3.A.gp.xl": 2})
    assert demand.max_units_per_region == 0
    pool = PoolInput(
        pool_id="r3.A.gp.xl",
        hall="A",
        sku="gp",
        size="xl",
        vcpu=8,
        memory_gib=32,
        price_per_hour=0.1,
        reclaimable_units=10,
        free=8,
    )
    out = plan(PlanInput(contracts=[demand], pools=[pool]))
    assert out.allocations == []
    assert out.outcomes[0].surplus_units == 4


def test_caps_round_like_exact_arithmetic() -> None:
    assert pool_share_cap(0.29, 100) == 29  # 0.29 * 100 is 28.999999999999996 in floats
    assert spread_cap(0.1, 30) == 3  # 0.1 * 30 is 3.0000000000000004
    assert spread_cap(0.25, 0) == 1
    gpu_unit = UnitShape(vcpu=2, memory_gib=4, gpus=1)  # fits no instance without a GPU
    assert contract_units_per_instance(gpu_unit, UnitShape(vcpu=16, memory_gib=64)) == 0


def test_plans_cross_the_temporal_data_converter() -> None:
    from temporalio.contrib.pydantic import pydantic_data_converter

    inp = r1_input()
    out = plan(inp)
    converter = pydantic_data_converter.payload_converter
    assert converter.from_payloads(converter.to_payloads([inp]), [PlanInput]) == [inp]
    assert converter.from_payloads(converter.to_payloads([out]), [Plan]) == [out]


def test_spread_cap_rounding_matches_the_definition() -> None:
    for fraction in (0.1, 0.25, 0.3, 0.5, 1.0):
        for total in range(0, 200):
            exact = max(1, math.ceil(round(fraction * total, 9)))
            assert spread_cap(fraction, total) == exact
