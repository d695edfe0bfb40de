"""The simulation loop: every policy, region by region, minute by minute, on one trace.

Each minute: hall losses start or end (everything in a lost hall is gone without
notice), booted instances come up, the trace's reclaims hit whoever holds the slots (a
notice with the region's lead: the instance drains and is replaced at once), the policy
plans on its tick and on every minute with notices, spend and instance time accrue, and
every tier-1 floor is checked whole or not.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from contracts.model import Contract, WorkloadKind
from contracts.region import Region
from estate.baselines import AllCommitted, KarpenterLike, Policy, PriceOnly, SkyPilotLike
from estate.config import EstateConfig
from estate.demand import BLOCK_MINUTES, demand_units
from estate.fleet import Fleet, tenants
from estate.results import (
    EstateResult,
    ExclusionResult,
    FallbackResult,
    FloorResult,
    Gap,
    KindLoss,
    PolicySummary,
    RegionRun,
)
from estate.sco import Sco
from estate.trace import RegionTrace, region_trace
from estate.work import lost_minutes, steps

POLICIES: tuple[str, ...] = (
    "sco",
    "price-only",
    "karpenter-like",
    "skypilot-like",
    "all-committed",
)

_BASELINES: dict[str, Callable[[Fleet, EstateConfig], Policy]] = {
    "price-only": PriceOnly,
    "karpenter-like": KarpenterLike,
    "skypilot-like": SkyPilotLike,
    "all-committed": AllCommitted,
}


def make_policy(name: str, fleet: Fleet, cfg: EstateConfig, trace: RegionTrace) -> Policy:
    if name == "sco":
        return Sco(fleet, cfg, trace)
    if name not in _BASELINES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return _BASELINES[name](fleet, cfg)


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
    )
    policy = make_policy(policy_name, fleet, cfg, trace)
    sco = policy if isinstance(policy, Sco) else None
    lead = float(region.notice_lead_seconds)
    loss = {k.value: KindLoss() for k in WorkloadKind}
    pool_reclaims: dict[str, int] = {}
    hourly: list[float] = []
    short_units = 0.0
    detect = cfg.floor_detect_minutes
    keeper_minutes = {x for h in trace.hall_losses for x in (h.start + detect, h.end + detect)}
    starts = {h.start: h for h in trace.hall_losses}
    ends = {h.end: h for h in trace.hall_losses}
    tier1 = [t for t, ten in enumerate(fleet.tenants) if ten.floor_units]
    whole = dict.fromkeys(tier1, True)
    whole_minutes = dict.fromkeys(tier1, 0)
    gap_start: dict[int, int] = {}
    gaps: dict[int, list[Gap]] = {t: [] for t in tier1}
    targets: list[int] = []
    # The plotted floor: the largest keeper's, in the region's first hall loss.
    plotted = (
        max(sco.keepers, key=lambda k: (k.instances, -k.tenant)) if sco and sco.keepers else None
    )
    trace_window = (
        (trace.hall_losses[0].start - 60, trace.hall_losses[0].end + 120)
        if trace.hall_losses
        else (0, -1)
    )
    floor_trace: dict[str, list[tuple[int, int]]] = {}
    last_units: dict[str, int] = {}
    exposed: set[int] = set()

    def record(kind: WorkloadKind, draw: float, *, notice: bool) -> None:
        entry = loss[kind.value]
        if notice:
            entry.reclaims += 1
            entry.lost_minutes += lost_minutes(kind, draw, cfg, lead_seconds=lead)
            entry.lost_minutes_periodic += lost_minutes(
                kind, draw, cfg, lead_seconds=lead, checkpoint_on_notice=False
            )
        else:
            entry.hall_lost += 1
            entry.hall_lost_minutes += lost_minutes(
                kind, draw, cfg, lead_seconds=lead, notice=False
            )

    for m in range(cfg.minutes):
        changed = False
        if m in starts:
            hall = starts[m].hall
            fleet.down.add(hall)
            rng = random.Random(f"{cfg.seed}:{region.id}:hall:{m}")
            for p, pool in enumerate(fleet.pools):
                if pool.hall == hall:
                    for t, n in sorted(fleet.held[p].items()):
                        for _ in range(n):
                            record(fleet.tenants[t].kind, rng.random(), notice=False)
                        fleet.remove(p, t, n, m)
            for g in [g for g in fleet.committed if g.hall == hall]:
                for _ in range(g.count):
                    record(fleet.tenants[g.tenant].kind, rng.random(), notice=False)
                fleet.uncommit(g, g.count)
            changed = True
        if m in ends:
            fleet.down.discard(ends[m].hall)
        if fleet.ready_queue and fleet.ready_queue[0][0] <= m:
            fleet.mature(m)
            changed = True
        if m in fleet.ready_minutes:
            changed = True
        noticed = False
        for hit in trace.hits.get(m, ()):
            p = hit.pool
            n = fleet.count(p)
            fleet.taken[p].extend([m] * len(hit.slots))
            if sco and sco.cycle.pools[p].state == "probing" and hit.slots[0] <= n:
                sco.cycle.pools[p].dirty = True  # the canary sits in the next slot
            ours = [(s, d) for s, d in zip(hit.slots, hit.draws, strict=True) if s < n]
            if not ours:
                continue
            victims = fleet.victims(p, [s for s, _ in ours])
            pool_id = region.pool_id(fleet.pools[p])
            for (slot, draw), t in zip(ours, victims, strict=True):
                record(fleet.tenants[t].kind, draw, notice=True)
                fleet.remove(p, t, 1, m)
                policy.reclaimed(p, m)
                if sco:
                    sco.cycle.notice(p, f"{m}:{p}:{slot}", m)
            pool_reclaims[pool_id] = pool_reclaims.get(pool_id, 0) + len(ours)
            noticed = changed = True
        if m % BLOCK_MINUTES == 0:
            targets = [
                demand_units(ten.contract, ten.name, region.id, m, cfg.seed)
                for ten in fleet.tenants
            ]
        tick = m % cfg.tick_minutes == 0
        if tick or noticed or m in keeper_minutes:
            policy.step(m, targets)
            changed = True
            if sco:
                exposed.update(p for p, h in enumerate(fleet.held) if h)
        if tick:
            # Demand no capacity was even launched for (booting instances count).
            for t in range(len(fleet.tenants)):
                held = fleet.units(t) + sum(
                    fleet.committed_units(t, role) for role in ("floor", "fallback", "committed")
                )
                short_units += max(0, targets[t] - held) * cfg.tick_minutes / 60.0
        if changed:
            if sco:
                sco.account(m)
            for t in tier1:
                if sco:
                    keeper = next(k for k in sco.keepers if k.tenant == t)
                    units = sum(sco.floor_units(keeper, m).values())
                else:
                    units = fleet.ready_units[t] + fleet.committed_units(t, "committed", m)
                ok = units >= fleet.tenants[t].floor_units
                if ok != whole[t]:
                    if not ok:
                        gap_start[t] = m
                    else:
                        gaps[t].append(_gap(gap_start.pop(t), m, trace, cfg))
                    whole[t] = ok
            if plotted and trace_window[0] <= m <= trace_window[1]:
                units_by_hall = sco.floor_units(plotted, m) if sco else {}
                for hall in sorted(set(units_by_hall) | set(last_units) | set(region.halls)):
                    u = units_by_hall.get(hall, 0)
                    if last_units.get(hall) != u:
                        floor_trace.setdefault(hall, []).append((m, u))
                        last_units[hall] = u
        for t in tier1:
            whole_minutes[t] += whole[t]
        fleet.accrue()
        if m % 60 == 59:
            hourly.append(round(fleet.cost, 4))
    for t, start in gap_start.items():
        gaps[t].append(_gap(start, cfg.minutes, trace, cfg))

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
    )
    if sco:
        out.fallback = [
            FallbackResult(
                region=region.id,
                contract=fleet.tenants[t].name,
                authority_per_hour=fleet.tenants[t].authority,
                max_spend_per_hour=round(log.max_spend, 6),
                minutes_over=log.minutes_over,
                launched=log.launched,
                declined=log.declined,
                reasons=log.reasons,
            )
            for t, log in sco.fallback.items()
        ]
        out.exclusion = _exclusion(sco, fleet, trace, exposed, cfg)
        if plotted:
            out.floor_trace = floor_trace
            out.floor_trace_contract = fleet.tenants[plotted.tenant].name
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


def _exclusion(
    sco: Sco, fleet: Fleet, trace: RegionTrace, exposed: set[int], cfg: EstateConfig
) -> ExclusionResult:
    region = fleet.region
    ids = [region.pool_id(p) for p in fleet.pools]
    ever = [i for i, c in enumerate(sco.cycle.pools) if c.timeline]
    return ExclusionResult(
        bad_pools=sorted(ids[i] for i in trace.bad_pools),
        excluded_pools=sorted(ids[i] for i in ever),
        bad_excluded=sorted(ids[i] for i in ever if i in trace.bad_pools),
        good_excluded=sorted(ids[i] for i in ever if i not in trace.bad_pools),
        exposed_good_pools=len(exposed - trace.bad_pools),
        probes=sco.cycle.probes,
        excluded_minutes={ids[i]: sco.cycle.excluded_minutes(i, cfg.minutes) for i in ever},
        timelines={ids[i]: sco.cycle.pools[i].timeline for i in sorted(trace.bad_pools)},
    )


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
    )


def simulate(
    regions: Sequence[Region],
    contracts: Sequence[Contract],
    cfg: EstateConfig,
    policies: Sequence[str] = POLICIES,
) -> EstateResult:
    """Every policy on every region of ``cfg`` (all of ``regions`` when it names none)."""
    chosen = [r for r in regions if not cfg.regions or r.id in cfg.regions]
    missing = set(cfg.regions) - {r.id for r in chosen}
    if missing:
        raise ValueError(f"regions {sorted(missing)} not among the loaded regions")
    traces = {r.id: region_trace(r, contracts, cfg) for r in chosen}
    runs = [run_region(r, contracts, cfg, traces[r.id], p) for p in policies for r in chosen]
    return EstateResult(
        days=cfg.days,
        seed=cfg.seed,
        regions=[r.id for r in chosen],
        tenants=cfg.tenants,
        pools=sum(len(r.pools) for r in chosen),
        bad_pools={
            r.id: sorted(r.pool_id(r.pools[i]) for i in traces[r.id].bad_pools) for r in chosen
        },
        hall_losses={
            r.id: [(h.hall, h.start, h.end) for h in traces[r.id].hall_losses] for r in chosen
        },
        policies=[summarise(p, [x for x in runs if x.policy == p], cfg) for p in policies],
        runs=runs,
    )
