"""Desired against actual, for one controller partition: pure and deterministic.

From a snapshot it plans every contract of the partition jointly (they contend for the
same pools), turns new allocations into acquisitions (split at the per-acquisition cap),
prices committed fallback for what reclaimable capacity cannot cover, and names the
instances beyond what demand needs: the controller releases those once idle long enough.

With headroom (``headroom=True``, contracts/headroom.py) a contract's target is its demand
plus its headroom units: that many more ready instances are held as cover, so a burst of
up to the headroom lands on instances already up, and the next plan refills the headroom.
Headroom is reclaimable only: committed fallback (money per hour, spend authority) is
bought for demand, never for idle cover, so the headroom's share of a shortfall is not
priced for fallback.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel

from activities.control.models import ContractView, ControllerSnapshot
from activities.events import CapacityType, InstanceState
from planning.arbiter import FallbackPlan, price_fallback
from planning.planner import Allocation, Plan, PlanInput, plan, units_per_instance
from workflows.acquisition.models import LaunchItem
from workflows.controller.models import ControllerConfig


class AcquisitionRequest(BaseModel):
    contract: str
    tier: int
    items: list[LaunchItem] = []
    fallback: FallbackPlan | None = None


class ReconcileResult(BaseModel):
    acquisitions: list[AcquisitionRequest] = []
    surplus: list[str] = []  # instance ids beyond demand, most expensive first
    demand_units: int = 0
    held_units: int = 0
    planned_units: int = 0
    shortfall_units: int = 0  # of demand (headroom not covered is headroom_short_units)
    plan_cost_per_hour: float = 0.0
    headroom_units: int = 0  # held as cover beyond demand, summed over contracts
    headroom_short_units: int = 0  # of that headroom, what reclaimable capacity cannot cover


def plan_input(
    snap: ControllerSnapshot, cfg: ControllerConfig, *, headroom: bool = False
) -> PlanInput:
    """The planner's problem for the snapshot: what open acquisitions ask for and what
    committed fallback already covers is not planned again. ``headroom``: each contract's
    target is its demand plus its headroom units."""
    demands = [
        v.demand.model_copy(
            update={
                "demand_units": max(
                    0,
                    v.demand.demand_units
                    + (v.headroom_units if headroom else 0)
                    - v.outstanding_units
                    - v.fallback_units,
                )
            }
        )
        for v in snap.contracts
    ]
    return PlanInput(
        contracts=demands, pools=snap.pools, spread_max_pool_fraction=cfg.spread_max_pool_fraction
    )


def reconcile(
    snap: ControllerSnapshot,
    cfg: ControllerConfig,
    now: datetime,
    planned: Plan | None = None,
    *,
    headroom: bool = False,
) -> ReconcileResult:
    """``planned``: the plan of ``plan_input(snap, cfg, headroom=headroom)`` when the
    caller has one (the exact planner's); without, the greedy planner's."""
    if not snap.contracts:
        return ReconcileResult()
    views = {v.demand.contract: v for v in snap.contracts}
    result = planned if planned is not None else plan(plan_input(snap, cfg, headroom=headroom))
    out = ReconcileResult(plan_cost_per_hour=result.cost_per_hour)
    by_contract: dict[str, list[Allocation]] = {}
    for alloc in result.allocations:
        by_contract.setdefault(alloc.contract, []).append(alloc)
    pools = {p.pool_id: p for p in snap.pools}
    for outcome in result.outcomes:
        view = views[outcome.contract]
        out.demand_units += view.demand.demand_units  # as asked, before netting in-flight work
        out.held_units += outcome.held_units
        out.planned_units += outcome.planned_units
        # The headroom is the last of the target to be covered: a shortfall eats it first.
        cover = view.headroom_units if headroom else 0
        short = max(0, outcome.shortfall_units - cover)
        out.shortfall_units += short
        out.headroom_units += cover
        out.headroom_short_units += outcome.shortfall_units - short
        items = [
            LaunchItem(
                pool_id=a.pool_id,
                hall=a.hall,
                flavor=f"{pools[a.pool_id].sku}.{pools[a.pool_id].size}",
                instances=a.instances,
                units=a.units,
            )
            for a in by_contract.get(outcome.contract, [])
        ]
        fallback = None
        if short > 0 and _may_fall_back(view, cfg, now):
            fallback = price_fallback(
                view.demand,
                short,
                snap.pools,
                snap.committed_rate,
                authority_per_hour=view.authority_per_hour,
                current_spend_per_hour=view.fallback_spend_per_hour,
            )
        for chunk in _chunks(items, cfg.max_instances_per_acquisition):
            out.acquisitions.append(
                AcquisitionRequest(contract=outcome.contract, tier=view.tier, items=chunk)
            )
        if fallback is not None:
            if out.acquisitions and out.acquisitions[-1].contract == outcome.contract:
                out.acquisitions[-1].fallback = fallback
            else:
                out.acquisitions.append(
                    AcquisitionRequest(contract=outcome.contract, tier=view.tier, fallback=fallback)
                )
        # Planned against demand net of committed fallback and open acquisitions, so the
        # planner's surplus is what the contract holds beyond need, fallback included.
        out.surplus += _release_candidates(view, snap, outcome.surplus_units)
    return out


def _may_fall_back(view: ContractView, cfg: ControllerConfig, now: datetime) -> bool:
    # Not while reclaimable launches are still in flight (their shortfall is not known
    # yet), not twice at once, and not again right after an operator or deadline declined.
    if view.outstanding_units > 0 or view.awaiting_approval:
        return False
    declined = view.fallback_declined_at
    return declined is None or now - declined >= timedelta(seconds=cfg.approval_timeout_seconds)


def _chunks(items: list[LaunchItem], cap: int) -> list[list[LaunchItem]]:
    chunks: list[list[LaunchItem]] = []
    current: list[LaunchItem] = []
    room = cap
    for item in items:
        left = item
        while left.instances > room:
            per = -(-left.units // left.instances)
            head = left.model_copy(update={"instances": room, "units": min(left.units, per * room)})
            current.append(head)
            chunks.append(current)
            current, room = [], cap
            left = left.model_copy(
                update={
                    "instances": left.instances - head.instances,
                    "units": left.units - head.units,
                }
            )
        current.append(left)
        room -= left.instances
        if room == 0:
            chunks.append(current)
            current, room = [], cap
    if current:
        chunks.append(current)
    return chunks


def _release_candidates(view: ContractView, snap: ControllerSnapshot, surplus: int) -> list[str]:
    """ACTIVE instances whose units together stay within `surplus`: committed fallback
    first, then the most expensive reclaimable, so what stays is the cheapest cover."""
    if surplus <= 0:
        return []
    pools = {p.pool_id: p for p in snap.pools}
    active = [i for i in view.instances if i.state is InstanceState.ACTIVE and i.pool_id in pools]
    active.sort(
        key=lambda i: (
            i.capacity_type is not CapacityType.COMMITTED,
            -i.price_per_hour,
            i.instance_id,
        )
    )
    picked: list[str] = []
    left = surplus
    for inst in active:
        units = units_per_instance(view.demand, pools[inst.pool_id])
        if 0 < units <= left:
            picked.append(inst.instance_id)
            left -= units
    return picked
