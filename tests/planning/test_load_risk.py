"""The owner-load risk (planning.costs.owner_load_rate, planning.models.LoadRisk): a pool
the owner has nearly filled is priced as one about to be reclaimed, before any notice, and
the planner steers new instances away from it."""

from __future__ import annotations

import pytest

from contracts.region import load_region
from planning.costs import owner_load_rate
from planning.models import LoadRisk
from planning.planner import ContractDemand, PlanInput, PoolInput, plan, pool_input, risk_cost
from tests.support.paths import REPO

pytestmark = pytest.mark.timeout(30)

R1 = REPO / "deploy" / "regions" / "r1.toml"


@pytest.mark.parametrize(
    ("free", "expected"),
    [
        (100, 0.0),  # all free
        (25, 0.0),  # at the knee: nothing expected yet
        (50, 0.0),
        (20, 0.4),  # a fifth below the knee: a fifth of the full rate
        (0, 2.0),  # nothing free: the full rate
        (-3, 2.0),  # a negative count is nothing free
    ],
)
def test_the_rate_rises_linearly_below_the_free_share(free: int, expected: float) -> None:
    assert owner_load_rate(free, 100, 2.0, 0.25) == pytest.approx(expected)


def test_off_or_empty_pool_expects_nothing() -> None:
    assert owner_load_rate(0, 100, 0.0, 0.25) == 0.0  # off
    assert owner_load_rate(0, 0, 2.0, 0.25) == 0.0  # a pool of no size


def test_pool_input_carries_the_rate_and_risk_cost_adds_it_to_the_observed_one() -> None:
    region = load_region(R1)
    pool = region.pools[0]
    size = pool.reclaimable_units
    full = pool_input(region, pool, free=0, reclaim_rate=0.2, load=LoadRisk(full_rate=2.0))
    assert full.load_rate == pytest.approx(2.0)
    # training loses an hour a reclaim: 0.2 observed + 2.0 expected from the load.
    assert risk_cost(full, "training") == pytest.approx(pool.price_per_hour * (1 + 2.2))
    roomy = pool_input(region, pool, free=size, reclaim_rate=0.2, load=LoadRisk(full_rate=2.0))
    assert roomy.load_rate == 0.0
    # Without a LoadRisk (every caller before it, and the default LoadRisk): as before.
    assert pool_input(region, pool, free=0, reclaim_rate=0.2).load_rate == 0.0
    assert pool_input(region, pool, free=0, load=LoadRisk()).load_rate == 0.0


def _pool(hall: str, price: float, free: int) -> PoolInput:
    return PoolInput(
        pool_id=f"r1.{hall}.gp.l",
        hall=hall,
        sku="gp",
        size="l",
        vcpu=8,
        memory_gib=32,
        price_per_hour=price,
        reclaimable_units=100,
        free=free,
        load_rate=owner_load_rate(free, 100, 2.0, 0.25),
    )


def test_the_planner_leaves_a_nearly_full_pool_for_a_dearer_roomy_one() -> None:
    """The cheaper pool has 10 % free (owner load: 1.2 reclaims expected per hour, CI
    priced 1.6x); the roomy one is 10 % dearer and gets the CI runners."""
    demand = ContractDemand(
        contract="ci",
        kind="ci",
        unit_vcpu=8,
        unit_memory_gib=32,
        skus=["gp"],
        sizes=["l"],
        halls=["h1", "h2"],
        demand_units=5,
        max_units_per_region=100,
        max_pool_share=1.0,
    )
    full, roomy = _pool("h1", 1.0, 10), _pool("h2", 1.1, 80)
    out = plan(PlanInput(contracts=[demand], pools=[full, roomy]))
    assert [(a.pool_id, a.instances) for a in out.allocations] == [("r1.h2.gp.l", 5)]
    # Without the load term the cheaper, nearly full pool wins.
    blind = [p.model_copy(update={"load_rate": 0.0}) for p in (full, roomy)]
    out = plan(PlanInput(contracts=[demand], pools=blind))
    assert [(a.pool_id, a.instances) for a in out.allocations] == [("r1.h1.gp.l", 5)]
