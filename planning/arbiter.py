"""The fallback arbiter: price committed capacity for a reclaimable shortfall, and decide
whether the contract's spend authority covers it.

Pure and deterministic (it runs inside workflows). Committed capacity is Blazar-reserved
capacity of a hall, priced per vCPU-hour by the region; an instance of shape (sku, size)
costs vcpu x that rate. The arbiter picks the contract's allowed shape with the lowest
committed cost per demand unit and spreads the instances round-robin over the contract's
halls that have committed capacity, so one hall's loss never takes all of a fallback.

Spend authority is money per hour for *all* of a contract's committed fallback: what it
already runs plus this proposal. Within it the acquisition proceeds at once (fallback
that never happens is the failure operators report most); above it an operator approves
or the acquisition declines at a deadline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from planning.models import ContractDemand, PoolInput, units_per_instance


class FallbackItem(BaseModel):
    model_config = ConfigDict(frozen=True)

    pool_id: str  # the hall's pool of this shape (instances are booked against it)
    hall: str
    flavor: str
    instances: int
    units: int
    price_per_hour: float  # committed price of one instance


class FallbackPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    contract: str
    shortfall_units: int
    items: list[FallbackItem]
    cost_per_hour: float  # of this proposal
    current_spend_per_hour: float  # committed fallback the contract already runs
    authority_per_hour: float
    needs_approval: bool
    reason: str

    @property
    def units(self) -> int:
        return sum(i.units for i in self.items)


def price_fallback(
    contract: ContractDemand,
    shortfall_units: int,
    pools: Sequence[PoolInput],
    committed_rate: Mapping[str, float],
    *,
    authority_per_hour: float,
    current_spend_per_hour: float = 0.0,
) -> FallbackPlan | None:
    """The cheapest committed fallback for `shortfall_units`, or None when the contract's
    halls have no committed capacity or no shape that holds one unit."""
    if shortfall_units <= 0:
        return None
    halls = sorted(h for h in contract.halls if h in committed_rate)
    shapes: dict[tuple[str, str], dict[str, PoolInput]] = {}
    for pool in pools:
        if (
            pool.hall in halls
            and pool.sku in contract.skus
            and pool.size in contract.sizes
            and units_per_instance(contract, pool) > 0
        ):
            shapes.setdefault((pool.sku, pool.size), {})[pool.hall] = pool
    if not shapes:
        return None

    def cost_per_unit(shape: tuple[str, str]) -> tuple[float, str, str]:
        by_hall = shapes[shape]
        pool = by_hall[min(by_hall)]
        rate = max(committed_rate[h] for h in by_hall)
        return (pool.vcpu * rate / units_per_instance(contract, pool), *shape)

    best = min(shapes, key=cost_per_unit)
    by_hall = shapes[best]
    per = units_per_instance(contract, by_hall[min(by_hall)])
    instances = math.ceil(shortfall_units / per)
    order = sorted(by_hall)
    counts = {h: 0 for h in order}
    for i in range(instances):
        counts[order[i % len(order)]] += 1
    items: list[FallbackItem] = []
    left = shortfall_units
    for hall in order:
        n = counts[hall]
        if n == 0:
            continue
        pool = by_hall[hall]
        units = min(left, n * per)
        left -= units
        items.append(
            FallbackItem(
                pool_id=pool.pool_id,
                hall=hall,
                flavor=f"{pool.sku}.{pool.size}",
                instances=n,
                units=units,
                price_per_hour=round(pool.vcpu * committed_rate[hall], 6),
            )
        )
    cost = round(sum(i.instances * i.price_per_hour for i in items), 6)
    total = current_spend_per_hour + cost
    needs_approval = total > authority_per_hour + 1e-9
    verdict = "exceeds" if needs_approval else "is within"
    reason = (
        f"{shortfall_units} units short on reclaimable capacity; committed fallback "
        f"{instances} x {best[0]}.{best[1]} costs {cost:.2f}/h; with "
        f"{current_spend_per_hour:.2f}/h already running, {total:.2f}/h {verdict} "
        f"the spend authority {authority_per_hour:.2f}/h"
    )
    return FallbackPlan(
        contract=contract.contract,
        shortfall_units=shortfall_units,
        items=items,
        cost_per_hour=cost,
        current_spend_per_hour=current_spend_per_hour,
        authority_per_hour=authority_per_hour,
        needs_approval=needs_approval,
        reason=reason,
    )
