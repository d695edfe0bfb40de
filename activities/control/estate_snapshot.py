"""The estate snapshot `sco contracts plan` reads (planning/change_plan.py EstateSnapshot),
from fleet state: the region's live instances (requested or active) with their capacity
(committed instances of the controller's fallback acquisitions are fallback, the others
floor), each contract's demand over its sources, and the pools' current prices.

Reclaim rates are left out (the plan then costs reclaimable capacity at its price alone).
"""

from __future__ import annotations

from datetime import datetime

from activities.control.models import ACQUISITION_PREFIX
from activities.events import CapacityType, InstanceState
from activities.fleet.control_state import ControlRepository
from activities.fleet.repository import FleetRepository, InstanceRow
from planning.change_plan import Capacity, EstateInstance, EstateSnapshot

_LIVE = (InstanceState.REQUESTED, InstanceState.ACTIVE)


def capacity_of(row: InstanceRow) -> Capacity:
    if row.capacity_type is CapacityType.RECLAIMABLE:
        return "reclaimable"
    if (row.acquisition_id or "").startswith(ACQUISITION_PREFIX):
        return "fallback"
    return "floor"


def estate_snapshot(
    fleet: FleetRepository, control: ControlRepository, region: str, now: datetime
) -> EstateSnapshot:
    rows = fleet.list_instances(region, _LIVE)
    return EstateSnapshot(
        region=region,
        taken_at=now.isoformat(),
        demand=control.demand_by_contract(region),
        instances=[
            EstateInstance(
                id=r.instance_id,
                contract=r.workload,
                pool_id=r.pool_id,
                capacity=capacity_of(r),
                price_per_hour=r.price_per_hour if capacity_of(r) == "fallback" else None,
            )
            for r in sorted(rows, key=lambda r: r.instance_id)
        ],
        prices={p.pool_id: p.price_per_hour for p in fleet.list_pools(region)},
    )
