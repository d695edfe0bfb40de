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
- Hall losses: a whole hall gone, without notice: Poisson events, some taking a second
  hall down too (overlapping losses), of varying length (``hall_loss_events``).
- Background: the owner's own workloads occupy a share of every pool, higher in office
  hours on weekdays (GPU pools are the busiest), so free capacity moves through the day
  and contracts compete for it.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from contracts.feasibility import units_per_instance
from contracts.model import Contract
from contracts.region import Region
from estate.config import EstateConfig


@dataclass(frozen=True)
class Hit:
    """Slots of one pool taken back in one minute; ``draws`` in [0, 1) per slot decide how
    far along the work on that slot was (work lost). ``holds``: the slots stay with the
    provider for ``reclaim_hold_minutes`` (a reclaim event); a drop of the pool's available
    slots holds nothing of its own (the available series already says what is left)."""

    pool: int
    slots: tuple[int, ...]
    draws: tuple[float, ...]
    burst: bool
    holds: bool = True


@dataclass(frozen=True)
class HallLoss:
    hall: str
    start: int  # minute
    end: int


@dataclass
class RegionTrace:
    region: str
    bad_pools: frozenset[int]
    rates: list[float]  # per pool, reclaims per instance-hour (the base process at minute 0)
    background: list[tuple[float, float]] = field(default_factory=list)  # (base, swing)
    hits: dict[int, list[Hit]] = field(default_factory=dict)  # minute -> hits
    hall_losses: list[HallLoss] = field(default_factory=list)
    available: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """Per pool: (minute, slots the owner leaves free) steps, from minute 0; a pool not
    here has ``background`` instead."""
    prices: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """Per pool: (minute, price per instance-hour) steps; a pool not here keeps its list
    price."""
    source: str = "synthetic"
    bad_epochs: list[tuple[int, frozenset[int]]] = field(default_factory=list)
    """(from minute, bad pools) when the bad pools move; empty: ``bad_pools`` throughout."""
    _cursor: dict[int, int] = field(default_factory=dict, repr=False)

    def busy(self, pool: int, minute: int) -> float:
        """Share of the pool the owner's own workloads occupy at ``minute``."""
        base, swing = self.background[pool]
        day, in_day = divmod(minute, 1440)
        hour = in_day / 60.0
        if day % 7 in (5, 6) or not 7.0 <= hour < 20.0:
            return base
        return base + swing * math.sin(math.pi * (hour - 7.0) / 13.0)

    def owner_free(self, pool: int, minute: int, slots: int) -> int:
        """Slots of the pool's ``slots`` the owner leaves to us at ``minute``."""
        steps = self.available.get(pool)
        if steps is None:
            return slots - math.ceil(slots * self.busy(pool, minute))
        return step_at(steps, minute, self._cursor, pool)

    def price_changes(self) -> dict[int, list[tuple[int, float]]]:
        """Minute -> (pool, new price), for the minutes after 0 a price changes."""
        out: dict[int, list[tuple[int, float]]] = {}
        for pool, steps in sorted(self.prices.items()):
            for minute, price in steps:
                if minute > 0:
                    out.setdefault(minute, []).append((pool, price))
        return out

    def price_at_start(self, pool: int, default: float) -> float:
        steps = self.prices.get(pool)
        return steps[0][1] if steps and steps[0][0] == 0 else default

    def bad_at(self, minute: int) -> frozenset[int]:
        bad = self.bad_pools
        for start, pools in self.bad_epochs:
            if start <= minute:
                bad = pools
        return bad

    def ever_bad(self) -> frozenset[int]:
        return self.bad_pools.union(*(p for _, p in self.bad_epochs))


def step_at(steps: Sequence[tuple[int, int]], minute: int, cursor: dict[int, int], key: int) -> int:
    """The value of a step series at ``minute``; ``cursor`` remembers the last index per
    key (the simulation asks in increasing minutes)."""
    i = cursor.get(key, 0)
    if i >= len(steps) or steps[i][0] > minute:
        i = max(0, bisect.bisect_right(steps, minute, key=lambda s: s[0]) - 1)
    while i + 1 < len(steps) and steps[i + 1][0] <= minute:
        i += 1
    cursor[key] = i
    return steps[i][1]


def drop_hits(
    pool: int, steps: Sequence[tuple[int, int]], rng: random.Random
) -> list[tuple[int, Hit]]:
    """A fall of the owner's free slots takes back the slots above the new level: ours
    (the lowest slots) are hit when the owner's load plus ours exceeds the capacity."""
    out = []
    for (_, before), (minute, after) in itertools.pairwise(steps):
        if after < before:
            slots = tuple(range(max(0, after), before))
            draws = tuple(rng.random() for _ in slots)
            out.append((minute, Hit(pool, slots, draws, burst=False, holds=False)))
    return out


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
    """The synthetic trace of ``region`` for ``cfg.seed``. Draws that only the calibrated
    generator makes come from a second stream, so the planted scenario (estate.config
    .PLANTED) draws exactly what it drew before the calibration."""
    rng = random.Random(f"estate:{cfg.seed}:{region.id}")
    more = random.Random(f"estate:{cfg.seed}:{region.id}:calibrated")
    minutes = cfg.minutes
    per_unit = cheapest_per_unit(region, contracts)
    usable = sorted((c, i) for i, c in enumerate(per_unit) if math.isfinite(c))
    if cfg.bad_pools_among == "cheapest-third":
        among = [i for _, i in usable[: max(1, len(usable) // 3)]]
    else:
        among = sorted(i for _, i in usable)
    bad = frozenset(rng.sample(among, min(cfg.bad_pools_per_region, len(among))))
    epochs = _bad_epochs(bad, among, cfg, more)
    clip = cfg.rate_clip
    good: list[float] = []
    rates = []
    for i in range(len(region.pools)):
        draw = (more if i in bad else rng).lognormvariate(0.0, 0.5)
        good.append(cfg.base_rate * min(clip, max(1.0 / clip, draw)))
        rates.append(cfg.bad_rate if i in bad else good[i])

    def is_bad(pool: int, minute: float) -> bool:
        current = bad
        for start, pools in epochs:
            if start <= minute:
                current = pools
        return pool in current

    def drift(minute: float) -> float:
        return 1.0 - cfg.rate_drift / 2.0 + cfg.rate_drift * minute / max(1, minutes)

    top_drift = 1.0 + cfg.rate_drift / 2.0
    varying = bool(epochs) or cfg.rate_drift > 0
    slots_at: dict[tuple[int, int], tuple[list[int], bool]] = {}

    def take(minute: int, pool: int, slot: int, burst: bool) -> None:
        entry = slots_at.setdefault((minute, pool), ([], False))
        if slot not in entry[0]:
            entry[0].append(slot)
        if burst and not entry[1]:
            slots_at[(minute, pool)] = (entry[0], True)

    def accept(rate_now: float, rate_max: float) -> bool:
        """Thinning: a candidate of the fastest process is kept at the rate of now (the
        stationary planted case draws nothing here)."""
        return not varying or more.random() * rate_max < rate_now

    for i, pool in enumerate(region.pools):
        cap = pool.reclaimable_units
        if cap <= 0:
            continue
        ever_bad = i in bad or any(i in p for _, p in epochs)
        # Base process: single slots, a Poisson process of rate * slots per hour.
        top = (max(good[i], cfg.bad_rate) if ever_bad else rates[i]) * (
            top_drift if varying else 1.0
        )
        per_minute = top * cap / 60.0
        t = rng.expovariate(per_minute) if per_minute > 0 else math.inf
        while t < minutes:
            now = (cfg.bad_rate if is_bad(i, t) else good[i]) * drift(t)
            slot = rng.randrange(cap)
            if accept(now, top):
                take(int(t), i, slot, False)
            t += rng.expovariate(per_minute)
        # Bursts.
        per_day_max = (
            max(cfg.bad_bursts_per_pool_day, cfg.bursts_per_pool_day)
            if ever_bad and varying
            else (cfg.bad_bursts_per_pool_day if i in bad else cfg.bursts_per_pool_day)
        ) * (top_drift if varying else 1.0)
        t = rng.expovariate(per_day_max / 1440.0) if per_day_max > 0 else math.inf
        while t < minutes:
            now_bad = is_bad(i, t)
            low, high = cfg.bad_burst_share if now_bad else cfg.burst_share
            k = max(1, min(cap, round(cap * rng.uniform(low, high))))
            chosen = rng.sample(range(cap), k)
            spread = [rng.randrange(cfg.burst_spread_minutes) for _ in chosen]
            per_day = (cfg.bad_bursts_per_pool_day if now_bad else cfg.bursts_per_pool_day) * drift(
                t
            )
            if accept(per_day, per_day_max):
                for slot, lag in zip(chosen, spread, strict=True):
                    at = int(t) + lag
                    if at < minutes:
                        take(at, i, slot, True)
            t += rng.expovariate(per_day_max / 1440.0)

    _region_bursts(region, cfg, more, take)

    background = []
    for pool in region.pools:
        if pool.gpus:
            background.append((rng.uniform(0.45, 0.7), rng.uniform(0.2, 0.3)))
        else:
            background.append((rng.uniform(0.1, 0.4), rng.uniform(0.0, 0.3)))
    trace = RegionTrace(
        region=region.id,
        bad_pools=bad,
        rates=rates,
        background=background,
        bad_epochs=epochs,
        source=f"synthetic seed {cfg.seed}",
    )
    for (minute, index), (slots, burst) in sorted(slots_at.items()):
        ordered = tuple(sorted(slots))
        draws = tuple(rng.random() for _ in ordered)
        trace.hits.setdefault(minute, []).append(Hit(index, ordered, draws, burst))
    for _ in range(cfg.hall_losses_per_region):
        start = rng.randrange(minutes // 5, max(minutes // 5 + 1, minutes * 4 // 5))
        hall = rng.choice(sorted(region.halls))
        trace.hall_losses.append(HallLoss(hall, start, min(minutes, start + cfg.hall_loss_minutes)))
    if cfg.owner_preempts:
        for i, pool in enumerate(region.pools):
            cap = pool.reclaimable_units
            steps: list[tuple[int, int]] = []
            for minute in range(0, minutes, 15):
                level = cap - math.ceil(cap * trace.busy(i, minute))
                if not steps or steps[-1][1] != level:
                    steps.append((minute, level))
            trace.available[i] = steps
            for minute, hit in drop_hits(i, steps, more):
                trace.hits.setdefault(minute, []).append(hit)
    trace.prices = _prices(region, cfg, more)
    halls = random.Random(f"estate:{cfg.seed}:{region.id}:halls")
    trace.hall_losses.extend(
        HallLoss(h, a, b)
        for h, a, b in hall_loss_events(
            sorted(region.halls),
            minutes,
            cfg.hall_losses_per_month,
            cfg.hall_loss_span,
            cfg.hall_loss_overlap,
            halls,
        )
    )
    trace.hall_losses.sort(key=lambda h: (h.start, h.hall))
    return trace


def hall_loss_events(
    halls: Sequence[str],
    minutes: int,
    per_month: float,
    span: tuple[int, int],
    overlap: float,
    rng: random.Random,
) -> list[tuple[str, int, int]]:
    """(hall, start, end) of hall losses: Poisson events at ``per_month`` per 30 days, each
    ``span`` minutes long (log-uniform); with chance ``overlap`` an event takes a second
    hall down too, starting within the first's first hour, so the two overlap."""
    out: list[tuple[str, int, int]] = []
    if per_month <= 0 or not halls:
        return out
    rate = per_month / (30 * 1440)  # per minute
    t = rng.expovariate(rate)
    lo, hi = math.log(max(1, span[0])), math.log(max(1, span[0], span[1]))
    while t < minutes:
        start = int(t)
        first = rng.choice(list(halls))
        length = round(math.exp(rng.uniform(lo, hi)))
        out.append((first, start, min(minutes, start + length)))
        others = [h for h in halls if h != first]
        if others and rng.random() < overlap:
            second = rng.choice(others)
            at = start + rng.randrange(0, min(60, length) + 1)
            length2 = round(math.exp(rng.uniform(lo, hi)))
            if at < minutes:
                out.append((second, at, min(minutes, at + length2)))
        t += rng.expovariate(rate)
    return out


def _bad_epochs(
    bad: frozenset[int], among: Sequence[int], cfg: EstateConfig, rng: random.Random
) -> list[tuple[int, frozenset[int]]]:
    """Every ``bad_redraw_days`` half the bad pools move to other pools."""
    if cfg.bad_redraw_days <= 0 or not bad:
        return []
    out: list[tuple[int, frozenset[int]]] = []
    step = round(cfg.bad_redraw_days * 1440)
    current = bad
    for start in range(step, cfg.minutes, step):
        keep = set(rng.sample(sorted(current), round(len(current) / 2)))
        others = [i for i in among if i not in current]
        keep.update(rng.sample(others, min(len(current) - len(keep), len(others))))
        current = frozenset(keep)
        out.append((start, current))
    return out


def _region_bursts(
    region: Region,
    cfg: EstateConfig,
    rng: random.Random,
    take: Callable[[int, int, int, bool], None],
) -> None:
    """Correlated bursts: every pool of one hall (or of one SKU in every hall) loses a
    share of its slots within ``burst_spread_minutes``."""
    if cfg.region_bursts_per_day <= 0:
        return
    t = rng.expovariate(cfg.region_bursts_per_day / 1440.0)
    halls = sorted(region.halls)
    skus = sorted({p.sku for p in region.pools})
    while t < cfg.minutes:
        if rng.random() < 0.5:
            hall = rng.choice(halls)
            members = [i for i, p in enumerate(region.pools) if p.hall == hall]
        else:
            sku = rng.choice(skus)
            members = [i for i, p in enumerate(region.pools) if p.sku == sku]
        low, high = cfg.burst_share
        for i in members:
            cap = region.pools[i].reclaimable_units
            if cap <= 0:
                continue
            k = max(1, min(cap, round(cap * rng.uniform(low, high))))
            for slot in rng.sample(range(cap), k):
                at = int(t) + rng.randrange(cfg.burst_spread_minutes)
                if at < cfg.minutes:
                    take(at, i, slot, True)
        t += rng.expovariate(cfg.region_bursts_per_day / 1440.0)


def _prices(
    region: Region, cfg: EstateConfig, rng: random.Random
) -> dict[int, list[tuple[int, float]]]:
    """List price times a hall factor and a pool factor, then a daily log-normal walk
    (kept within half and twice the list price)."""
    if not (cfg.hall_price_spread or cfg.pool_price_spread or cfg.price_walk_per_day):
        return {}
    hall_factor = {
        h: rng.uniform(1 - cfg.hall_price_spread, 1 + cfg.hall_price_spread)
        for h in sorted(region.halls)
    }
    out = {}
    for i, pool in enumerate(region.pools):
        listed = pool.price_per_hour
        price = listed * hall_factor[pool.hall]
        price *= rng.uniform(1 - cfg.pool_price_spread, 1 + cfg.pool_price_spread)
        steps = [(0, round(price, 6))]
        for day in range(1, math.ceil(cfg.minutes / 1440)):
            if cfg.price_walk_per_day:
                price *= rng.lognormvariate(0.0, cfg.price_walk_per_day)
                price = min(2 * listed, max(listed / 2, price))
                steps.append((day * 1440, round(price, 6)))
        out[i] = steps
    return out
