"""The estate's reclaim environment: when the provider takes capacity back, generated once
per region and seed and shared by every policy (common random numbers).

A pool lends ``reclaimable_units`` instance *slots*. Whoever runs in a pool holds its first
slots; an event takes back some slots, and hits the instances of a policy that holds one
of them. So a per-instance rate means the same for every policy, and two policies with the
same instances in a pool see the same reclaims, while a policy that stays out of a pool
sees none of its reclaims.

- Base rate: each good pool reclaims single slots at a log-normal rate around
  ``base_rate`` per instance-hour; a few *bad* pools at ``bad_rate``. The bad pools are
  drawn among each region's cheapest third of the pools some contract can use (a pool
  nobody would choose could not tell the policies apart).
- Bursts: a share of the pool's slots taken back within ``burst_spread_minutes``; bad
  pools burst more often and take more.
- Hall losses: a whole hall gone, without notice, for ``hall_loss_minutes``.
- Background: the owner's own workloads occupy a share of every pool, higher in office
  hours on weekdays (GPU pools are the busiest), so free capacity moves through the day
  and contracts compete for it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from contracts.feasibility import units_per_instance
from contracts.model import Contract
from contracts.region import Region
from estate.config import EstateConfig


@dataclass(frozen=True)
class Hit:
    """Slots of one pool taken back in one minute; ``draws`` in [0, 1) per slot decide how
    far along the work on that slot was (work lost)."""

    pool: int
    slots: tuple[int, ...]
    draws: tuple[float, ...]
    burst: bool


@dataclass(frozen=True)
class HallLoss:
    hall: str
    start: int  # minute
    end: int


@dataclass
class RegionTrace:
    region: str
    bad_pools: frozenset[int]
    rates: list[float]  # per pool, reclaims per instance-hour (the base process)
    background: list[tuple[float, float]] = field(default_factory=list)  # (base, swing)
    hits: dict[int, list[Hit]] = field(default_factory=dict)  # minute -> hits
    hall_losses: list[HallLoss] = field(default_factory=list)

    def busy(self, pool: int, minute: int) -> float:
        """Share of the pool the owner's own workloads occupy at ``minute``."""
        base, swing = self.background[pool]
        day, in_day = divmod(minute, 1440)
        hour = in_day / 60.0
        if day % 7 in (5, 6) or not 7.0 <= hour < 20.0:
            return base
        return base + swing * math.sin(math.pi * (hour - 7.0) / 13.0)


def cheapest_per_unit(region: Region, contracts: Sequence[Contract]) -> list[float]:
    """Per pool: the lowest price per demand unit any contract would pay there (inf: no
    contract may use it)."""
    out = []
    for pool in region.pools:
        best = math.inf
        for c in contracts:
            p = c.placement
            if pool.sku not in p.skus or pool.size not in p.sizes or pool.hall not in p.halls:
                continue
            u = c.unit
            fits = units_per_instance(u, pool)
            if fits:
                best = min(best, pool.price_per_hour / fits)
        out.append(best)
    return out


def region_trace(region: Region, contracts: Sequence[Contract], cfg: EstateConfig) -> RegionTrace:
    rng = random.Random(f"estate:{cfg.seed}:{region.id}")
    minutes = cfg.minutes
    per_unit = cheapest_per_unit(region, contracts)
    usable = sorted((c, i) for i, c in enumerate(per_unit) if math.isfinite(c))
    cheap = [i for _, i in usable[: max(1, len(usable) // 3)]]
    bad = frozenset(rng.sample(cheap, min(cfg.bad_pools_per_region, len(cheap))))
    rates = []
    for i in range(len(region.pools)):
        rates.append(cfg.bad_rate if i in bad else cfg.base_rate * rng.lognormvariate(0.0, 0.5))

    slots_at: dict[tuple[int, int], tuple[list[int], bool]] = {}

    def take(minute: int, pool: int, slot: int, burst: bool) -> None:
        entry = slots_at.setdefault((minute, pool), ([], False))
        if slot not in entry[0]:
            entry[0].append(slot)
        if burst and not entry[1]:
            slots_at[(minute, pool)] = (entry[0], True)

    for i, pool in enumerate(region.pools):
        cap = pool.reclaimable_units
        if cap <= 0:
            continue
        # Base process: single slots, a Poisson process of rate * slots per hour.
        per_minute = rates[i] * cap / 60.0
        t = rng.expovariate(per_minute) if per_minute > 0 else math.inf
        while t < minutes:
            take(int(t), i, rng.randrange(cap), False)
            t += rng.expovariate(per_minute)
        # Bursts.
        per_day = cfg.bad_bursts_per_pool_day if i in bad else cfg.bursts_per_pool_day
        low, high = cfg.bad_burst_share if i in bad else cfg.burst_share
        t = rng.expovariate(per_day / 1440.0) if per_day > 0 else math.inf
        while t < minutes:
            k = max(1, min(cap, round(cap * rng.uniform(low, high))))
            for slot in rng.sample(range(cap), k):
                at = int(t) + rng.randrange(cfg.burst_spread_minutes)
                if at < minutes:
                    take(at, i, slot, True)
            t += rng.expovariate(per_day / 1440.0)

    background = []
    for pool in region.pools:
        if pool.gpus:
            background.append((rng.uniform(0.45, 0.7), rng.uniform(0.2, 0.3)))
        else:
            background.append((rng.uniform(0.1, 0.4), rng.uniform(0.0, 0.3)))
    trace = RegionTrace(region=region.id, bad_pools=bad, rates=rates, background=background)
    for (minute, index), (slots, burst) in sorted(slots_at.items()):
        ordered = tuple(sorted(slots))
        draws = tuple(rng.random() for _ in ordered)
        trace.hits.setdefault(minute, []).append(Hit(index, ordered, draws, burst))
    for _ in range(cfg.hall_losses_per_region):
        start = rng.randrange(minutes // 5, max(minutes // 5 + 1, minutes * 4 // 5))
        hall = rng.choice(sorted(region.halls))
        trace.hall_losses.append(HallLoss(hall, start, min(minutes, start + cfg.hall_loss_minutes)))
    return trace
