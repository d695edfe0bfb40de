"""The capacity lifecycle's estate figures (issue 31): SCO's lifecycle against SCO today and
a Karpenter-like consolidation, every policy on the same trace per region
(estate/lifecycle_sim.py says what each one is).

Figures:
- voluntary churn: voluntary disruptions (an instance drained and deleted by the policy's
  own choice to replace it) per 1,000 reclaimable instance-hours;
- cost saved by return from fallback (`sco-today` less `sco-return`) and by consolidation
  (`sco-return` less `sco-lifecycle`), measured on the same trace, not estimated;
- work lost to voluntary disruptions, in unit-hours (each drains with the region's lead);
- fallback spend while reclaimable capacity was back (an allowed, admitted pool had a free
  instance), against today's.

Targets: SCO's churn at most a third of the Karpenter-like baseline's at equal or lower
cost; fallback spend after capacity returns at most 10 % of today's.

The calibrated generator rarely runs a region out of reclaimable capacity, so little
fallback is ever bought. Capacity crunches (``crunch_hours`` every ``crunch_every_days``,
from 10:00 of the first day on) are laid over the trace: the owner's load leaves no free
slot in any pool of the region (what it already lends stays), the contracts with a spend
authority fall back, and when the crunch ends reclaimable capacity is back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

from pydantic import BaseModel

from contracts.model import Contract
from contracts.region import Region
from estate.config import EstateConfig
from estate.engine import run_region
from estate.lifecycle_sim import LIFECYCLE_POLICIES
from estate.results import RegionRun
from estate.trace import RegionTrace, region_trace


@dataclass
class CrunchTrace(RegionTrace):
    """A trace whose owner leaves no free slot during the crunches ([start, end) minutes)."""

    crunches: list[tuple[int, int]] = field(default_factory=list)

    def owner_free(self, pool: int, minute: int, slots: int) -> int:
        if any(start <= minute < end for start, end in self.crunches):
            return 0
        return super().owner_free(pool, minute, slots)


def crunches(cfg: EstateConfig, hours: float, every_days: float) -> list[tuple[int, int]]:
    """The crunch windows in minutes: from 10:00 of day 0, every ``every_days`` days."""
    if hours <= 0 or every_days <= 0:
        return []
    out, start, step = [], 600, round(every_days * 1440)
    while start < cfg.minutes:
        out.append((start, min(cfg.minutes, start + round(hours * 60))))
        start += step
    return out


def with_crunches(trace: RegionTrace, windows: list[tuple[int, int]]) -> RegionTrace:
    if not windows:
        return trace
    copied = {f.name: getattr(trace, f.name) for f in fields(RegionTrace)}
    copied["_cursor"] = {}
    return CrunchTrace(**copied, crunches=windows)


POLICY_NAMES: tuple[str, ...] = tuple(p.name for p in LIFECYCLE_POLICIES)
CHURN_TARGET = 1 / 3
FALLBACK_TARGET = 0.10


class LifecyclePolicyResult(BaseModel):
    policy: str
    cost: float
    fallback_cost: float
    fallback_cost_capacity_back: float
    reclaimable_instance_hours: float
    voluntary_disruptions: int
    disruptions_by_reason: dict[str, int]
    churn_per_1000h: float
    voluntary_lost_unit_hours: float
    unserved_unit_hours: float
    reclaims: int


class LifecycleResult(BaseModel):
    crunches: list[tuple[int, int]]  # minutes [start, end) with no free slot anywhere
    days: float
    seed: int
    regions: list[str]
    tenants: int
    policies: list[LifecyclePolicyResult]
    saved_by_return_from_fallback: float
    saved_by_consolidation: float
    churn_vs_baseline: float | None  # sco-lifecycle / karpenter-consolidation
    cost_vs_baseline: float  # sco-lifecycle cost / karpenter-consolidation cost
    fallback_after_return_vs_today: float | None  # capacity-back fallback spend
    churn_target_met: bool
    fallback_target_met: bool

    def policy(self, name: str) -> LifecyclePolicyResult:
        return next(p for p in self.policies if p.policy == name)


def _summary(name: str, runs: Sequence[RegionRun]) -> LifecyclePolicyResult:
    hours = sum(r.reclaimable_instance_hours for r in runs)
    by: dict[str, int] = {}
    for r in runs:
        for k, v in r.lifecycle.items():
            if k.startswith("disruptions_"):
                by[k.removeprefix("disruptions_")] = by.get(k, 0) + int(v)
    n = sum(by.values())
    return LifecyclePolicyResult(
        policy=name,
        cost=round(sum(r.cost for r in runs), 2),
        fallback_cost=round(sum(r.lifecycle.get("fallback_cost", 0.0) for r in runs), 2),
        fallback_cost_capacity_back=round(
            sum(r.lifecycle.get("fallback_cost_capacity_back", 0.0) for r in runs), 2
        ),
        reclaimable_instance_hours=round(hours, 1),
        voluntary_disruptions=n,
        disruptions_by_reason=dict(sorted(by.items())),
        churn_per_1000h=round(1000.0 * n / hours, 3) if hours else 0.0,
        voluntary_lost_unit_hours=round(
            sum(r.lifecycle.get("voluntary_lost_unit_hours", 0.0) for r in runs), 3
        ),
        unserved_unit_hours=round(sum(r.unserved_unit_hours for r in runs), 1),
        reclaims=sum(r.reclaims for r in runs),
    )


def evaluate_lifecycle(
    regions: Sequence[Region],
    contracts: Sequence[Contract],
    cfg: EstateConfig,
    traces: Mapping[str, RegionTrace] | None = None,
    *,
    crunch_hours: float = 6.0,
    crunch_every_days: float = 2.0,
) -> LifecycleResult:
    """The four lifecycle policies on every region of ``cfg`` (all of ``regions`` when it
    names none), one trace per region shared by all four, capacity crunches laid over it
    (``crunch_hours`` 0: none)."""
    chosen = [r for r in regions if not cfg.regions or r.id in cfg.regions]
    missing = set(cfg.regions) - {r.id for r in chosen}
    if missing:
        raise ValueError(f"regions {sorted(missing)} not among the loaded regions")
    given = traces or {}
    windows = crunches(cfg, crunch_hours, crunch_every_days)
    shared = {
        r.id: with_crunches(given.get(r.id) or region_trace(r, contracts, cfg), windows)
        for r in chosen
    }
    runs = {
        name: [run_region(r, contracts, cfg, shared[r.id], name) for r in chosen]
        for name in POLICY_NAMES
    }
    out = [_summary(name, runs[name]) for name in POLICY_NAMES]
    by = {p.policy: p for p in out}
    today, ret, sco, base = (
        by["sco-today"],
        by["sco-return"],
        by["sco-lifecycle"],
        by["karpenter-consolidation"],
    )
    churn = round(sco.churn_per_1000h / base.churn_per_1000h, 4) if base.churn_per_1000h else None
    fallback_ratio = (
        round(sco.fallback_cost_capacity_back / today.fallback_cost_capacity_back, 4)
        if today.fallback_cost_capacity_back
        else None
    )
    return LifecycleResult(
        crunches=windows,
        days=cfg.days,
        seed=cfg.seed,
        regions=[r.id for r in chosen],
        tenants=cfg.tenants,
        policies=out,
        saved_by_return_from_fallback=round(today.cost - ret.cost, 2),
        saved_by_consolidation=round(ret.cost - sco.cost, 2),
        churn_vs_baseline=churn,
        cost_vs_baseline=round(sco.cost / base.cost, 4) if base.cost else 1.0,
        fallback_after_return_vs_today=fallback_ratio,
        churn_target_met=(
            (churn is None and sco.voluntary_disruptions == 0)
            or (churn is not None and churn <= CHURN_TARGET)
        )
        and sco.cost <= base.cost + 1e-6,
        fallback_target_met=fallback_ratio is None or fallback_ratio <= FALLBACK_TARGET,
    )
