"""The peers' placement policies, each as small as its public documentation describes it.

- ``price-only``: the cheapest pool per unit first; no reclaim risk, no exclusion.
- ``karpenter-like``: EC2 Fleet's price-capacity-optimized strategy (the pools with the
  most capacity available, then the lowest price among them), and Karpenter's unavailable
  offerings cache: a pool is not used for 3 minutes after an insufficient-capacity error or
  an interruption in it.
- ``skypilot-like``: the optimizer's cheapest placement; after a preemption the pool (a
  zone) is blocked and failover goes elsewhere; the pool is retried later (here: after
  ``skypilot_block_minutes``).
- ``all-committed``: every unit on committed capacity, bought to fit, in the arbiter's
  cheapest committed shape, spread round-robin over the healthy halls.

Every policy honours each contract's own placement (SKUs, sizes, halls, pool share cap)
and releases what demand no longer needs, dearest first; none of the spot baselines has
a floor or committed fallback (their tier-1 services run on reclaimable capacity).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from estate.config import EstateConfig
from estate.fleet import Committed, Fleet, ceil_div
from estate.policy import PolicyBase
from estate.trace import RegionTrace
from planning.arbiter import price_fallback
from planning.costs import pool_share_cap
from planning.models import PoolInput, pool_input


class PerContract(PolicyBase):
    """Each contract's demand placed on its own, in the policy's pool order; a pool it
    blocks (after a reclaim, say) is skipped until its minute."""

    def __init__(self, fleet: Fleet, cfg: EstateConfig, trace: RegionTrace) -> None:
        super().__init__(fleet, cfg, trace)
        self.blocked: dict[int, int] = {}  # pool -> minute it may be used again

    def step(self, minute: int, targets: Sequence[int]) -> None:
        for t in range(len(self.fleet.tenants)):
            self.place(t, minute, targets[t])

    def place(self, t: int, minute: int, target: int) -> None:
        fleet = self.fleet
        have = fleet.units(t)
        if have > target:
            release(fleet, t, have - target, self.dearest_first(t), minute)
        elif have < target:
            fill(fleet, self.cfg, t, target - have, self.order(t, minute), minute)

    def order(self, t: int, minute: int) -> list[int]:
        return self.cheapest_first(t, minute)

    def usable(self, t: int, minute: int) -> list[int]:
        fleet = self.fleet
        hold = self.cfg.reclaim_hold_minutes
        return [
            p
            for p in fleet.tenants[t].allowed
            if self.blocked.get(p, -1) <= minute and fleet.free(p, minute, hold) > 0
        ]

    def cheapest_first(self, t: int, minute: int) -> list[int]:
        upi = self.fleet.tenants[t].upi
        return sorted(self.usable(t, minute), key=lambda p: (self.fleet.price[p] / upi[p], p))

    def dearest_first(self, t: int) -> list[int]:
        upi = self.fleet.tenants[t].upi
        held = [p for p, h in enumerate(self.fleet.held) if t in h]
        return sorted(held, key=lambda p: (-self.fleet.price[p] / upi[p], p))


class PriceOnly(PerContract):
    name = "price-only"


class KarpenterLike(PerContract):
    name = "karpenter-like"

    def order(self, t: int, minute: int) -> list[int]:
        fleet = self.fleet
        upi = fleet.tenants[t].upi
        hold = self.cfg.reclaim_hold_minutes
        cands = self.usable(t, minute)
        if not cands:
            return []
        free = {p: fleet.free(p, minute, hold) for p in cands}
        depth = sorted(free.values())[len(cands) // 2]
        deep = [p for p in cands if free[p] >= depth]
        rest = [p for p in cands if free[p] < depth]

        def price(p: int) -> tuple[float, int]:
            return (fleet.price[p] / upi[p], p)

        return sorted(deep, key=price) + sorted(rest, key=price)

    def on_reclaim(self, pool: int, instance_id: str, minute: int) -> None:
        self.blocked[pool] = minute + self.cfg.karpenter_unavailable_minutes


class SkyPilotLike(PerContract):
    name = "skypilot-like"

    def on_reclaim(self, pool: int, instance_id: str, minute: int) -> None:
        self.blocked[pool] = minute + self.cfg.skypilot_block_minutes


class AllCommitted(PerContract):
    name = "all-committed"

    def place(self, t: int, minute: int, target: int) -> None:
        fleet = self.fleet
        tenant = fleet.tenants[t]
        have = fleet.committed_units(t, "committed")
        if have > target:
            release_committed(fleet, t, "committed", have - target)
            return
        if have == target:
            return
        rates = {h: r for h, r in fleet.committed_rate.items() if h not in fleet.down}
        offer = price_fallback(
            tenant.demand,
            target - have,
            pool_inputs(fleet, minute, self.cfg),
            rates,
            authority_per_hour=math.inf,
        )
        if offer is None:
            return
        index = pool_index(fleet)
        for item in offer.items:
            fleet.commit(
                Committed(
                    tenant=t,
                    hall=item.hall,
                    pool=index[item.pool_id],
                    count=item.instances,
                    price=item.price_per_hour,
                    ready=minute + self.cfg.committed_boot_minutes,
                    role="committed",
                )
            )


def fill(fleet: Fleet, cfg: EstateConfig, t: int, need: int, order: list[int], minute: int) -> None:
    """Whole instances in ``order`` until ``need`` units are covered, within free capacity
    and the contract's pool share cap."""
    tenant = fleet.tenants[t]
    share = tenant.demand.max_pool_share
    for p in order:
        if need <= 0:
            return
        upi = tenant.upi[p]
        cap = pool_share_cap(share, fleet.pools[p].reclaimable_units) - fleet.held[p].get(t, 0)
        n = min(ceil_div(need, upi), cap, fleet.free(p, minute, cfg.reclaim_hold_minutes))
        if n > 0:
            fleet.launch(p, t, n, minute, cfg.boot_minutes)
            need -= n * upi


def release(fleet: Fleet, t: int, surplus: int, order: list[int], minute: int) -> None:
    """Whole instances, in ``order``, as long as the rest still covers demand."""
    upi = fleet.tenants[t].upi
    for p in order:
        if surplus < upi[p]:
            continue
        n = min(surplus // upi[p], fleet.held[p].get(t, 0))
        surplus -= fleet.remove(p, t, n, minute) * upi[p]


def release_committed(fleet: Fleet, t: int, role: str, surplus: int) -> None:
    upi = fleet.tenants[t].upi
    for g in reversed([g for g in fleet.committed if g.tenant == t and g.role == role]):
        n = min(surplus // upi[g.pool], g.count)
        if n:
            surplus -= n * upi[g.pool]
            fleet.uncommit(g, n)


def pool_index(fleet: Fleet) -> dict[str, int]:
    return {fleet.region.pool_id(p): i for i, p in enumerate(fleet.pools)}


def pool_inputs(
    fleet: Fleet,
    minute: int,
    cfg: EstateConfig,
    rates: list[float] | None = None,
    excluded: set[int] | None = None,
) -> list[PoolInput]:
    return [
        pool_input(
            fleet.region,
            pool,
            free=fleet.free(i, minute, cfg.reclaim_hold_minutes),
            reclaim_rate=rates[i] if rates else 0.0,
            excluded=bool(excluded and i in excluded) or pool.hall in fleet.down,
        )
        for i, pool in enumerate(fleet.pools)
    ]
