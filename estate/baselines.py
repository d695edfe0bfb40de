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

Since issue 34, fair comparators (each with the same committed fallback as SCO when
``baseline_fallback`` is on: the product's arbiter, within the contract's spend authority,
at the same committed price):

- ``price-history``: cheapest first by SCO's own risk price (planning.costs.expected_cost
  on the reclaim rate each pool showed this policy over the rate window), no exclusion.
- ``block-backoff``: cheapest first; a reclaim blocks the pool for 15 minutes, doubling
  with each further reclaim up to 24 hours (SkyPilot's failover with backoff); a day
  without one forgets the strikes.
- ``karpenter-pco``: price-capacity-optimized on a capacity signal that means something
  here (the share of the pool's slots still free: a full pool is the one the owner's load
  takes back first), the cheapest of the deeper half first; a pool is unavailable for
  3 minutes after an interruption or a launch that could not be filled (the ICE cache);
  what spot cannot hold falls back to committed (the on-demand fallback).

Every policy honours each contract's own placement (SKUs, sizes, halls, pool share cap)
and releases what demand no longer needs, dearest first; none of the spot baselines has
a floor keeper (their tier-1 services run on reclaimable capacity and the fallback).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from estate import fallback
from estate.config import EstateConfig
from estate.fallback import FallbackLog, release_committed
from estate.fleet import Committed, Fleet, ceil_div
from estate.policy import PolicyBase
from estate.results import FallbackResult, RegionRun
from estate.trace import RegionTrace
from planning.arbiter import price_fallback
from planning.costs import expected_cost, pool_share_cap
from planning.models import PoolInput, pool_input


class PerContract(PolicyBase):
    """Each contract's demand placed on its own, in the policy's pool order; a pool it
    blocks (after a reclaim, say) is skipped until its minute."""

    def __init__(self, fleet: Fleet, cfg: EstateConfig, trace: RegionTrace) -> None:
        super().__init__(fleet, cfg, trace)
        self.blocked: dict[int, int] = {}  # pool -> minute it may be used again
        self.fallback = {t: FallbackLog() for t in range(len(fleet.tenants))}
        self.index = pool_index(fleet)

    def step(self, minute: int, targets: Sequence[int]) -> None:
        for t in range(len(self.fleet.tenants)):
            self.place(t, minute, targets[t])
        if self.cfg.baseline_fallback:
            pools: list[PoolInput] | None = None
            for t in range(len(self.fleet.tenants)):
                short = max(0, targets[t] - self.fleet.units(t))
                if short or self.fleet.committed_units(t, "fallback"):
                    pools = pools or pool_inputs(self.fleet, minute, self.cfg)
                    fallback.arbitrate(
                        self.fleet, self.cfg, t, short, pools, self.index, minute,
                        self.fallback[t],
                    )  # fmt: skip

    def place(self, t: int, minute: int, target: int) -> None:
        fleet = self.fleet
        have = fleet.units(t)
        if have > target:
            release(fleet, t, have - target, self.dearest_first(t), minute)
        elif have < target:
            left = fill(fleet, self.cfg, t, target - have, self.order(t, minute), minute)
            if left > 0:
                self.unfilled(t, minute)

    def unfilled(self, t: int, minute: int) -> None:
        """Spot could not hold the tenant's demand this step."""

    def after_change(self, minute: int) -> None:
        if self.cfg.baseline_fallback:
            fallback.watch(self.fleet, self.fallback)

    def report(self, out: RegionRun) -> None:
        if not self.cfg.baseline_fallback:
            return
        out.fallback = [
            FallbackResult(
                region=out.region,
                contract=self.fleet.tenants[t].name,
                authority_per_hour=self.fleet.tenants[t].authority,
                max_spend_per_hour=round(log.max_spend, 6),
                minutes_over=log.minutes_over,
                launched=log.launched,
                declined=log.declined,
                refused_units=log.refused_units,
                reasons=log.reasons,
            )
            for t, log in self.fallback.items()
        ]

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


class PriceHistory(PerContract):
    name = "price-history"

    def __init__(self, fleet: Fleet, cfg: EstateConfig, trace: RegionTrace) -> None:
        super().__init__(fleet, cfg, trace)
        self.notices_by_day: list[dict[int, int]] = [{} for _ in fleet.pools]

    def on_reclaim(self, pool: int, instance_id: str, minute: int) -> None:
        day = self.notices_by_day[pool]
        day[minute // 1440] = day.get(minute // 1440, 0) + 1

    def order(self, t: int, minute: int) -> list[int]:
        fleet = self.fleet
        tenant = fleet.tenants[t]
        kind = tenant.kind.value

        def risk(p: int) -> tuple[float, int]:
            rate = fleet.rate(p, self.notices_by_day[p], minute, self.cfg.rate_window_days)
            return (expected_cost(fleet.price[p], rate, kind) / tenant.upi[p], p)

        return sorted(self.usable(t, minute), key=risk)


class BlockBackoff(PerContract):
    name = "block-backoff"
    first_block = 15
    longest_block = 1440

    def __init__(self, fleet: Fleet, cfg: EstateConfig, trace: RegionTrace) -> None:
        super().__init__(fleet, cfg, trace)
        self.strikes: dict[int, tuple[int, int]] = {}  # pool -> (strikes, last minute)

    def on_reclaim(self, pool: int, instance_id: str, minute: int) -> None:
        strikes, last = self.strikes.get(pool, (0, minute))
        if minute - last >= 1440:
            strikes = 0
        if self.blocked.get(pool, -1) > minute:
            return  # the same burst: the pool is blocked already
        block = min(self.longest_block, self.first_block * 2**strikes)
        self.blocked[pool] = minute + block
        self.strikes[pool] = (strikes + 1, minute)


class KarpenterPco(PerContract):
    name = "karpenter-pco"

    def order(self, t: int, minute: int) -> list[int]:
        fleet = self.fleet
        upi = fleet.tenants[t].upi
        hold = self.cfg.reclaim_hold_minutes
        cands = self.usable(t, minute)
        if not cands:
            return []
        depth = {
            p: fleet.free(p, minute, hold) / max(1, fleet.pools[p].reclaimable_units) for p in cands
        }
        middle = sorted(depth.values())[len(cands) // 2]

        def price(p: int) -> tuple[float, int]:
            return (fleet.price[p] / upi[p], p)

        deep = sorted((p for p in cands if depth[p] >= middle), key=price)
        return deep + sorted((p for p in cands if depth[p] < middle), key=price)

    def on_reclaim(self, pool: int, instance_id: str, minute: int) -> None:
        self.blocked[pool] = minute + self.cfg.karpenter_unavailable_minutes

    def unfilled(self, t: int, minute: int) -> None:
        # Every pool tried and left short is an insufficient-capacity error: cached.
        for p in self.fleet.tenants[t].allowed:
            if self.fleet.free(p, minute, self.cfg.reclaim_hold_minutes) == 0:
                self.blocked[p] = minute + self.cfg.karpenter_unavailable_minutes


class AllCommitted(PerContract):
    name = "all-committed"

    def step(self, minute: int, targets: Sequence[int]) -> None:
        for t in range(len(self.fleet.tenants)):
            self.place(t, minute, targets[t])

    def report(self, out: RegionRun) -> None:
        pass

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
            pool = index[item.pool_id]
            fleet.commit(
                Committed(
                    tenant=t,
                    hall=item.hall,
                    pool=pool,
                    count=item.instances,
                    price=item.price_per_hour
                    if not fleet.committed_markup
                    else fleet.committed_price(pool, item.hall),
                    ready=minute + self.cfg.committed_boot_minutes,
                    role="committed",
                )
            )


def fill(fleet: Fleet, cfg: EstateConfig, t: int, need: int, order: list[int], minute: int) -> int:
    """Whole instances in ``order`` until ``need`` units are covered, within free capacity
    and the contract's pool share cap; returns the units still uncovered."""
    tenant = fleet.tenants[t]
    share = tenant.demand.max_pool_share
    for p in order:
        if need <= 0:
            return 0
        upi = tenant.upi[p]
        cap = pool_share_cap(share, fleet.pools[p].reclaimable_units) - fleet.held[p].get(t, 0)
        n = min(ceil_div(need, upi), cap, fleet.free(p, minute, cfg.reclaim_hold_minutes))
        if n > 0:
            fleet.launch(p, t, n, minute, cfg.boot_minutes)
            need -= n * upi
    return max(0, need)


def release(fleet: Fleet, t: int, surplus: int, order: list[int], minute: int) -> None:
    """Whole instances, in ``order``, as long as the rest still covers demand."""
    upi = fleet.tenants[t].upi
    for p in order:
        if surplus < upi[p]:
            continue
        n = min(surplus // upi[p], fleet.held[p].get(t, 0))
        surplus -= fleet.remove(p, t, n, minute) * upi[p]


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
