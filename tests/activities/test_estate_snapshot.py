"""`sco contracts estate`: the snapshot `sco contracts plan` reads, from a scratch fleet
state: live instances with their capacity (fallback = committed of a controller
acquisition, floor = the other committed ones), demand per contract, current prices; and
a plan of "no change" over it costs the same before and after."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from activities.control.estate_snapshot import estate_snapshot
from activities.events import CapacityType
from activities.fleet.repository import InstanceSpec
from contracts.compiler import compile_dir
from contracts.region import Region
from planning.change_plan import plan_change
from tests.support.control_harness import fleet_repositories
from tests.support.paths import REPO

pytestmark = pytest.mark.timeout(120)


def test_snapshot_classifies_capacity_and_feeds_the_plan(region_r1: Region) -> None:
    with fleet_repositories(region_r1) as (fleet, control):
        specs = [
            InstanceSpec(
                instance_id="i-spot",
                region="r1",
                pool_id="r1.A.gp.xl",
                capacity_type=CapacityType.RECLAIMABLE,
                workload="spark-etl",
                tier=2,
            ),
            InstanceSpec(
                instance_id="i-floor",
                region="r1",
                pool_id="r1.B.cpu.xl",
                capacity_type=CapacityType.COMMITTED,
                workload="search-api",
                tier=1,
                acquisition_id="floor-r1-search-api-B-abc123",
                price_per_hour=0.176,
            ),
            InstanceSpec(
                instance_id="i-fallback",
                region="r1",
                pool_id="r1.A.cpu.2xl",
                capacity_type=CapacityType.COMMITTED,
                workload="search-api",
                tier=1,
                acquisition_id="acq-r1-search-api-1",
                price_per_hour=0.352,
            ),
        ]
        for s in specs:
            fleet.record_acquire(s)
        control.set_demand("r1", "cli", {"search-api": 40, "spark-etl": 12})
        snap = estate_snapshot(fleet, control, "r1", datetime(2026, 12, 1, tzinfo=UTC))
    by_id = {i.id: i for i in snap.instances}
    assert {k: v.capacity for k, v in by_id.items()} == {
        "i-spot": "reclaimable",
        "i-floor": "floor",
        "i-fallback": "fallback",
    }
    assert by_id["i-fallback"].price_per_hour == 0.352
    assert snap.demand == {"search-api": 40, "spark-etl": 12}
    assert snap.prices["r1.A.gp.xl"] == region_r1.pool("r1.A.gp.xl").price_per_hour
    contracts = compile_dir(REPO / "contracts" / "examples", {"r1": region_r1}).contracts
    plan = plan_change("a", "b", contracts, contracts, region_r1, snap)
    assert plan.feasible and not plan.contracts and not plan.drift
    assert plan.cost_before == plan.cost_after
    assert plan.cost_before.fallback_running == 0.352
