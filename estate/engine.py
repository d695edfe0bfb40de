"""The simulation loop: every policy, region by region, minute by minute, on one trace.

Each minute: hall losses start or end (everything in a lost hall is gone without
notice), booted instances come up, the trace's reclaims hit whoever holds the slots (a
notice with the region's lead: the instance drains and is replaced at once), the policy
probes (a floor keeper judges hall losses from its probes: estate.halls) and plans on its
tick, on every minute with notices and when a verdict changed, spend and instance time
accrue, and every tier-1 floor is checked whole or not. Minutes below floor count from the
loss itself, for every policy alike: detection is part of each policy's time below.
What a policy decides, hears and measures goes through its hooks (estate.policy.Policy),
the same for SCO and every peer: the loop never asks which policy it runs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence

from contracts.model import Contract, WorkloadKind
from contracts.region import Region
from estate.baselines import (
    AllCommitted,
    BlockBackoff,
    KarpenterLike,
    KarpenterPco,
    PriceHistory,
    PriceOnly,
    SkyPilotLike,
)
from estate.config import EstateConfig
from estate.demand import BLOCK_MINUTES, demand_units
from estate.fleet import Fleet, tenants
from estate.lifecycle_sim import LIFECYCLE_POLICIES
from estate.policy import Policy
from estate.recovery import SkyPilotEager, SkyPilotRecovery, SpotHedge
from estate.results import (
    EstateResult,
    FloorResult,
    Gap,
    KindLoss,
    PolicySummary,
    RegionRun,
)
from estate.sco import Sco, ScoNoExclusion, ScoNoRisk, ScoNoSpread
from estate.trace import RegionTrace, region_trace
from estate.work import lost_minutes, steps

#: Every policy by name, in the order runs and reports list them.
_POLICIES: dict[str, Callable[[Fleet, EstateConfig, RegionTrace], Policy]] = {
    p.name: p
    for p in (
        Sco,
        PriceOnly,
        KarpenterLike,
        SkyPilotLike,
        AllCommitted,
        PriceHistory,
        BlockBackoff,
        KarpenterPco,
        ScoNoExclusion,
        ScoNoRisk,
        ScoNoSpread,
        SkyPilotRecovery,
        SkyPilotEager,
        SpotHedge,
    )
}
POLICIES: tuple[str, ...] = tuple(_POLICIES)
#: The policies before issue 34 (the planted scenario's comparison).
LEGACY_POLICIES: tuple[str, ...] = POLICIES[:5]
#: SCO with one part switched off.
ABLATIONS: tuple[str, ...] = ("sco-no-exclusion", "sco-no-risk", "sco-no-spread")
#: The fair comparators: each with SCO's committed fallback and authority.
BASELINES: tuple[str, ...] = (
    "price-only",
    "price-history",
    "block-backoff",
    "karpenter-pco",
    "skypilot-recovery",
    "skypilot-eager",
    "spothedge",
)


#: The capacity lifecycle's comparison (estate/lifecycle_sim.py, `sco sim lifecycle`): run
#: by name, not among every run's default policies.
_LIFECYCLE: dict[str, Callable[[Fleet, EstateConfig, RegionTrace], Policy]] = {
    p.name: p for p in LIFECYCLE_POLICIES
}


def make_policy(name: str, fleet: Fleet, cfg: EstateConfig, trace: RegionTrace) -> Policy:
    make = _POLICIES.get(name) or _LIFECYCLE.get(name)
    if make is None:
        known = ", ".join((*POLICIES, *_LIFECYCLE))
        raise ValueError(f"unknown policy {name!r}; known: {known}")
    return make(fleet, cfg, trace)


def run_region(
    region: Region,
    contracts: Sequence[Contract],
    cfg: EstateConfig,
    trace: RegionTrace,
    policy_name: str,
) -> RegionRun:
    rates = {h: c.price_per_vcpu_hour for h, c in region.committed.items()}
    fleet = Fleet(
        region=region,
        tenants=tenants(region, contracts, cfg.tenants),
        committed_rate=rates,
        trace=trace,
        committed_markup=cfg.committed_markup,
        warm_start=cfg.warm_start,
    )
    policy = make_policy(policy_name, fleet, cfg, trace)
    lead = float(region.notice_lead_seconds)
    loss = {k.value: KindLoss() for k in WorkloadKind}
    pool_reclaims: dict[str, int] = {}
    hourly: list[float] = []
    short_units = 0.0
    starts: dict[int, list[str]] = {}
    ends: dict[int, list[str]] = {}
    for h in trace.hall_losses:
        starts.setdefault(h.start, []).append(h.hall)
        ends.setdefault(h.end, []).append(h.hall)
    price_changes = trace.price_changes()
    # One set of measures for every policy (issue 34): from ready capacity only.
    served = unserved = lost_units = 0.0
    below_floor = dict.fromkeys(tier_one(fleet), 0)
    short_since: dict[int, int] = {}
    waits: list[int] = []
    forced = 0  # instances the engine took (reclaims, hall losses); the rest left by choice
    ready = [0] * len(fleet.tenants)
    tier1 = [t for t, ten in enumerate(fleet.tenants) if ten.floor_units]
    whole = dict.fromkeys(tier1, True)
    whole_minutes = dict.fromkeys(tier1, 0)
    gap_start: dict[int, int] = {}
    gaps: dict[int, list[Gap]] = {t: [] for t in tier1}
    targets: list[int] = []
    # The plotted floor, in the region's first hall loss.
    trace_window = (
        (trace.hall_losses[0].start - 60, trace.hall_losses[0].end + 120)
        if trace.hall_losses
        else (0, -1)
    )
    floor_trace: dict[str, list[tuple[int, int]]] = {}
    last_units: dict[str, int] = {}

    def record(kind: WorkloadKind, draw: float, *, notice: bool, units: int) -> None:
        nonlocal lost_units
        entry = loss[kind.value]
        if notice:
            entry.reclaims += 1
            lost = lost_minutes(kind, draw, cfg, lead_seconds=lead)
            entry.lost_minutes += lost
            entry.lost_minutes_periodic += lost_minutes(
                kind, draw, cfg, lead_seconds=lead, checkpoint_on_notice=False
            )
        else:
            entry.hall_lost += 1
            lost = lost_minutes(kind, draw, cfg, lead_seconds=lead, notice=False)
            entry.hall_lost_minutes += lost
        lost_units += lost * units / 60.0

    for m in range(cfg.minutes):
        changed = False
        fleet.now = m
        for hall in starts.get(m, ()):
            fleet.down.add(hall)
            rng = random.Random(f"{cfg.seed}:{region.id}:hall:{m}")
            for p, pool in enumerate(fleet.pools):
                if pool.hall == hall:
                    for t, n in sorted(fleet.held[p].items()):
                        for _ in range(n):
                            record(
                                fleet.tenants[t].kind,
                                rng.random(),
                                notice=False,
                                units=fleet.tenants[t].upi[p],
                            )
                        forced += fleet.remove(p, t, n, m)
            for g in [g for g in fleet.committed if g.hall == hall]:
                for _ in range(g.count):
                    record(
                        fleet.tenants[g.tenant].kind,
                        rng.random(),
                        notice=False,
                        units=fleet.tenants[g.tenant].upi[g.pool],
                    )
                fleet.uncommit(g, g.count)
            changed = True
        for hall in ends.get(m, ()):
            if not any(h.hall == hall and h.start <= m < h.end for h in trace.hall_losses):
                fleet.down.discard(hall)
        for p, price in price_changes.get(m, ()):
            fleet.set_price(p, price)
        if fleet.ready_queue and fleet.ready_queue[0][0] <= m:
            fleet.mature(m)
            changed = True
        if m in fleet.ready_minutes:
            changed = True
        noticed = False
        for hit in trace.hits.get(m, ()):
            p = hit.pool
            n = fleet.count(p)
            if hit.holds:
                fleet.taken[p].extend([m] * len(hit.slots))
            policy.on_hit(p, hit.slots, m)
            ours = [(s, d) for s, d in zip(hit.slots, hit.draws, strict=True) if s < n]
            if not ours:
                continue
            victims = fleet.victims(p, [s for s, _ in ours])
            pool_id = region.pool_id(fleet.pools[p])
            for (slot, draw), t in zip(ours, victims, strict=True):
                record(fleet.tenants[t].kind, draw, notice=True, units=fleet.tenants[t].upi[p])
                forced += fleet.remove(p, t, 1, m)
                policy.on_reclaim(p, f"{m}:{p}:{slot}", m)
            pool_reclaims[pool_id] = pool_reclaims.get(pool_id, 0) + len(ours)
            noticed = changed = True
        if m % BLOCK_MINUTES == 0:
            targets = [
                demand_units(ten.contract, ten.name, region.id, m, cfg.seed)
                for ten in fleet.tenants
            ]
        tick = m % cfg.tick_minutes == 0
        probed = policy.probe(m)  # a keeper's verdict: detected, never read from the trace
        if tick or noticed or probed:
            policy.step(m, targets)
            changed = True
            if fleet.ready_queue and fleet.ready_queue[0][0] <= m:
                fleet.mature(m)  # a warm start: minute 0's instances are up at minute 0
        if tick:
            # Demand no capacity was even launched for (booting instances count).
            for t in range(len(fleet.tenants)):
                held = fleet.units(t) + sum(
                    fleet.committed_units(t, role) for role in ("floor", "fallback", "committed")
                )
                short_units += max(0, targets[t] - held) * cfg.tick_minutes / 60.0
        if changed or tick:
            ready = serving(fleet, m)
            for t in range(len(fleet.tenants)):
                if ready[t] < targets[t]:
                    short_since.setdefault(t, m)
                elif t in short_since:
                    waits.append(m - short_since.pop(t))
            if tick:
                for t in range(len(fleet.tenants)):
                    got = min(ready[t], targets[t])
                    served += got * cfg.tick_minutes / 60.0
                    unserved += (targets[t] - got) * cfg.tick_minutes / 60.0
        if changed:
            policy.after_change(m)
            for t in tier1:
                ok = policy.floor_units(t, m) >= fleet.tenants[t].floor_units
                if ok != whole[t]:
                    if not ok:
                        gap_start[t] = m
                    else:
                        gaps[t].append(_gap(gap_start.pop(t), m, trace, cfg))
                    whole[t] = ok
            units_by_hall = (
                policy.floor_by_hall(m) if trace_window[0] <= m <= trace_window[1] else None
            )
            if units_by_hall is not None:
                for hall in sorted(set(units_by_hall) | set(last_units) | set(region.halls)):
                    u = units_by_hall.get(hall, 0)
                    if last_units.get(hall) != u:
                        floor_trace.setdefault(hall, []).append((m, u))
                        last_units[hall] = u
        for t in tier1:
            whole_minutes[t] += whole[t]
        for t in below_floor:
            below_floor[t] += ready[t] < fleet.tenants[t].floor_units
        fleet.accrue()
        if m % 60 == 59:
            hourly.append(round(fleet.cost, 4))
    for t, start in gap_start.items():
        gaps[t].append(_gap(start, cfg.minutes, trace, cfg))
    waits.extend(cfg.minutes - since for since in short_since.values())

    floors = [
        FloorResult(
            region=region.id,
            contract=fleet.tenants[t].name,
            floor_units=fleet.tenants[t].floor_units,
            minutes=cfg.minutes,
            whole_minutes=whole_minutes[t],
            gaps=gaps[t],
        )
        for t in tier1
    ]
    out = RegionRun(
        policy=policy_name,
        region=region.id,
        cost=round(fleet.cost, 4),
        cost_reclaimable=round(fleet.cost_reclaimable, 4),
        cost_committed={k: round(v, 4) for k, v in sorted(fleet.cost_committed.items())},
        reclaimable_instance_hours=round(fleet.reclaimable_minutes / 60.0, 3),
        reclaims=sum(v.reclaims for v in loss.values()),
        short_unit_hours=round(short_units, 3),
        loss=loss,
        floors=floors,
        pool_reclaims=dict(sorted(pool_reclaims.items())),
        hourly_cost=hourly,
        floor_trace=floor_trace,
        served_unit_hours=round(served, 3),
        unserved_unit_hours=round(unserved, 3),
        lost_unit_hours=round(lost_units, 4),
        below_floor_minutes=sum(below_floor.values()),
        capacity_waits=waits,
        voluntary_releases=fleet.removed - forced,
        acquisitions=fleet.acquisitions,
        instances_launched=fleet.launched,
    )
    policy.report(out)
    return out


def tier_one(fleet: Fleet) -> list[int]:
    return [t for t, ten in enumerate(fleet.tenants) if ten.floor_units]


def serving(fleet: Fleet, minute: int) -> list[int]:
    """Units each tenant has up and useful: booted reclaimable instances and every
    committed group that is ready (floor, fallback, all-committed alike)."""
    out = list(fleet.ready_units)
    for g in fleet.committed:
        if g.ready <= minute:
            out[g.tenant] += g.count * fleet.tenants[g.tenant].upi[g.pool]
    return out


def _gap(start: int, end: int, trace: RegionTrace, cfg: EstateConfig) -> Gap:
    bound = cfg.floor_detect_minutes + cfg.committed_boot_minutes
    for h in trace.hall_losses:
        if h.start <= start and end <= h.start + bound:
            return Gap(
                start=start,
                end=end,
                explained=True,
                why=f"hall {h.hall} lost at minute {h.start}: rebuild window ("
                f"{cfg.floor_detect_minutes} min to detect, "
                f"{cfg.committed_boot_minutes} min to boot)",
            )
        if h.end <= start and end <= h.end + bound:
            return Gap(start=start, end=end, explained=True, why=f"hall {h.hall} back: rebalance")
    return Gap(start=start, end=end, explained=False, why="reclaims left the floor short")


def summarise(name: str, runs: Sequence[RegionRun], cfg: EstateConfig) -> PolicySummary:
    hours = sum(r.reclaimable_instance_hours for r in runs)
    reclaims = sum(r.reclaims for r in runs)
    per_kind: dict[str, float] = {}
    for kind in WorkloadKind:
        n = sum(r.loss[kind.value].reclaims for r in runs)
        lost = sum(r.loss[kind.value].lost_minutes for r in runs)
        per_kind[kind.value] = round(lost / n, 3) if n else 0.0
    train = [r.loss[WorkloadKind.TRAINING.value] for r in runs]
    n_train = sum(x.reclaims for x in train)
    floors = [f for r in runs for f in r.floors]
    minutes = sum(f.minutes for f in floors)
    gap = sum(g.end - g.start for f in floors for g in f.gaps)
    unexplained = sum(g.end - g.start for f in floors for g in f.gaps if not g.explained)
    fallback = [f for r in runs for f in r.fallback]
    share = max(
        (f.max_spend_per_hour / f.authority_per_hour for f in fallback if f.authority_per_hour),
        default=0.0,
    )
    excl = [r.exclusion for r in runs if r.exclusion]
    wrong = good_time = None
    if excl:
        exposed = sum(e.exposed_good_pools for e in excl)
        wrong = round(sum(len(e.good_excluded) for e in excl) / exposed, 4) if exposed else 0.0
        good = sum(e.excluded_minutes[p] for e in excl for p in e.good_excluded)
        every = sum(sum(e.excluded_minutes.values()) for e in excl)
        good_time = round(good / every, 4) if every else 0.0
    return PolicySummary(
        policy=name,
        cost=round(sum(r.cost for r in runs), 2),
        reclaimable_instance_hours=round(hours, 1),
        reclaims=reclaims,
        reclaims_per_1000h=round(1000.0 * reclaims / hours, 3) if hours else 0.0,
        short_unit_hours=round(sum(r.short_unit_hours for r in runs), 1),
        lost_minutes_per_reclaim=per_kind,
        training_steps_per_reclaim=round(
            steps(sum(x.lost_minutes for x in train), cfg) / n_train, 1
        )
        if n_train
        else 0.0,
        training_steps_per_reclaim_periodic=round(
            steps(sum(x.lost_minutes_periodic for x in train), cfg) / n_train, 1
        )
        if n_train
        else 0.0,
        floor_availability=round((minutes - gap) / minutes, 6) if minutes else 1.0,
        floor_gap_minutes=gap,
        floor_unexplained_gap_minutes=unexplained,
        fallback_minutes_over=sum(f.minutes_over for f in fallback),
        fallback_max_share_of_authority=round(share, 4),
        wrongly_excluded_share=wrong,
        good_excluded_time_share=good_time,
        acquisitions=sum(r.acquisitions for r in runs),
        instances_launched=sum(r.instances_launched for r in runs),
        **fair_measures(runs),
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by the nearest-rank method; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))])


def fair_measures(runs: Sequence[RegionRun]) -> dict[str, float | int]:
    """The measures every policy is held to alike (issue 34)."""
    served = sum(r.served_unit_hours for r in runs)
    cost = sum(r.cost for r in runs)
    lost = sum(r.lost_unit_hours for r in runs)
    return {
        "served_unit_hours": round(served, 1),
        "unserved_unit_hours": round(sum(r.unserved_unit_hours for r in runs), 1),
        "cost_per_served_unit_hour": round(cost / served, 6) if served else 0.0,
        "p99_time_to_capacity_minutes": percentile(
            [w for r in runs for w in r.capacity_waits], 0.99
        ),
        "work_lost_per_1000_unit_hours": round(1000.0 * lost / served, 4) if served else 0.0,
        "below_floor_minutes": sum(r.below_floor_minutes for r in runs),
        "fallback_refused_units": sum(f.refused_units for r in runs for f in r.fallback),
        "voluntary_releases": sum(r.voluntary_releases for r in runs),
    }


def simulate(
    regions: Sequence[Region],
    contracts: Sequence[Contract],
    cfg: EstateConfig,
    policies: Sequence[str] = POLICIES,
    traces: Mapping[str, RegionTrace] | None = None,
) -> EstateResult:
    """Every policy on every region of ``cfg`` (all of ``regions`` when it names none), on
    the given traces (by region id) or the synthetic generator's."""
    chosen = [r for r in regions if not cfg.regions or r.id in cfg.regions]
    missing = set(cfg.regions) - {r.id for r in chosen}
    if missing:
        raise ValueError(f"regions {sorted(missing)} not among the loaded regions")
    given = traces or {}
    traces = {r.id: given.get(r.id) or region_trace(r, contracts, cfg) for r in chosen}
    runs = [run_region(r, contracts, cfg, traces[r.id], p) for p in policies for r in chosen]
    return EstateResult(
        days=cfg.days,
        seed=cfg.seed,
        regions=[r.id for r in chosen],
        tenants=cfg.tenants,
        pools=sum(len(r.pools) for r in chosen),
        bad_pools={
            r.id: sorted(r.pool_id(r.pools[i]) for i in traces[r.id].ever_bad()) for r in chosen
        },
        hall_losses={
            r.id: [(h.hall, h.start, h.end) for h in traces[r.id].hall_losses] for r in chosen
        },
        policies=[summarise(p, [x for x in runs if x.policy == p], cfg) for p in policies],
        runs=runs,
    )
