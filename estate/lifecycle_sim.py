"""Capacity lifecycle in the estate simulator: return from fallback and consolidation by the
same pure code the lifecycle workflow runs (planning/lifecycle.plan_lifecycle), against
SCO as it runs today and a Karpenter-like consolidation on the same trace.

Four policies, each SCO's planner, arbiter, exclusion cycle and floor keepers (estate.sco):

- `sco-today`: the region controller as it is without the lifecycle workflow. Committed
  fallback covers demand until the demand drops (the controller nets fallback units out of
  what it plans, and releases fallback first among surplus), so once bought it runs on even
  when reclaimable capacity returns.
- `sco-return`: today's plus the lifecycle's return from fallback (consolidation off).
- `sco-lifecycle`: today's plus the whole lifecycle with SCO's anti-churn (a minimum age,
  a target pool free on `stable_rounds` rounds in a row, a saving margin, one
  consolidation per contract per round) and each contract's disruption budget (default
  10 %).
- `karpenter-consolidation`: today's plus the same code with Karpenter's consolidation
  settings: WhenEmptyOrUnderutilized with consolidateAfter 0 (no minimum age, no
  hysteresis, any saving), no disruption budgets, and a replacement of at most one
  instance (Karpenter never replaces one node with several). It runs on the same rounds
  as SCO's (the controller's tick): Karpenter evaluates continuously, so this is the
  baseline's lower bound on churn.

Every replacement is make-before-break as in the workflow: the replacement launches (each
of its instances, when a fallback returns as several smaller ones), the
old instance is told to drain when the replacement is up and is gone the region's notice
lead later; that is one voluntary disruption, and its lost work is the drain's
(estate.work.lost_minutes with notice). While it is under way the controller counts the
replacement as needed (the workflow's replacements are not surplus until the old is gone).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import ClassVar

from contracts.disruption import Budget, Disruption, DisruptionReason
from estate import fallback
from estate.config import EstateConfig
from estate.fleet import Fleet
from estate.results import RegionRun
from estate.sco import Sco
from estate.trace import RegionTrace
from estate.work import lost_minutes
from planning.costs import pool_share_cap
from planning.lifecycle import (
    AntiChurn,
    ContractLife,
    LifeInstance,
    LifePool,
    Replacement,
    SpreadMember,
    next_consolidation_streak,
    next_streak,
    plan_lifecycle,
    spread_rooms,
)
from planning.models import PlanInput, PoolInput

#: Minute 0 of a simulation, as the planner's clock.
EPOCH = datetime(2026, 1, 5, tzinfo=UTC)
#: Karpenter's consolidation without budgets: every instance may go at once.
NO_BUDGETS = Disruption(budgets=[Budget(max_percent=100)])
#: The estate's planner plans with PlanInput's default spread fraction (estate.sco).
SPREAD_MAX_POOL_FRACTION: float = PlanInput.model_fields["spread_max_pool_fraction"].default
#: Karpenter replaces a node with "existing capacity plus a single new cheaper node"
#: (kubernetes-sigs/karpenter designs/consolidation.md, "Node Replacement"): it never
#: splits one node into several, so its return from fallback is one-for-one.
KARPENTER_ANTI_CHURN = AntiChurn(
    min_age_seconds=0,
    stable_rounds=1,
    min_saving_per_hour=0,
    consolidation_margin=0,
    max_return_parts=1,
)


def _at(minute: int) -> datetime:
    return EPOCH + timedelta(minutes=minute)


class ScoToday(Sco):
    """The controller without the lifecycle: fallback is netted out of what it plans and
    released only as surplus (first among surplus), never replaced."""

    name = "sco-today"

    def __init__(self, fleet: Fleet, cfg: EstateConfig, trace: RegionTrace) -> None:
        super().__init__(fleet, cfg, trace)
        n = len(fleet.tenants)
        # Units of replacements launched whose old instances are not gone yet.
        self.pending_units = [0] * n
        # Fallback spend accrued while an allowed reclaimable pool had room for it.
        self.fallback_cost_capacity_back = 0.0
        self._last_accrual = 0

    def step(self, minute: int, targets: Sequence[int]) -> None:
        fleet = self.fleet
        self._accrue_fallback(minute)
        net: list[int] = []
        for t, tenant in enumerate(fleet.tenants):
            wanted = max(0, targets[t] - tenant.floor_units)
            fb = fleet.committed_units(t, "fallback")
            surplus = fleet.held_units[t] - self.pending_units[t] + fb - wanted
            if surplus > 0 and fb:
                fallback.release_committed(fleet, t, "fallback", min(surplus, fb))
                fb = fleet.committed_units(t, "fallback")
            net.append(max(0, targets[t] - fb) + self.pending_units[t])
        super().step(minute, net)

    def arbitrate(self, t: int, shortfall: int, pools: list[PoolInput], minute: int) -> None:
        if shortfall <= 0:
            return  # what fallback runs stays: the controller nets it out of its plan
        have = self.fleet.committed_units(t, "fallback")
        fallback.arbitrate(
            self.fleet,
            self.cfg,
            t,
            have + shortfall,
            pools,
            self.index,
            minute,
            self.fallback[t],
        )

    def _accrue_fallback(self, minute: int) -> None:
        """Fallback spend since the last step, where reclaimable capacity had returned for
        it: the free instances of the tenant's allowed, admitted pools hold at least the
        units its fallback holds."""
        fleet, span = self.fleet, minute - self._last_accrual
        self._last_accrual = minute
        if span <= 0:
            return
        excluded = self.cycles.excluded()
        hold = self.cfg.reclaim_hold_minutes
        for t, tenant in enumerate(fleet.tenants):
            spend = fallback.spend(fleet, t)
            if spend and sum(
                fleet.free(p, minute, hold) * tenant.upi[p]
                for p in tenant.allowed
                if p not in excluded
            ) >= fleet.committed_units(t, "fallback"):
                self.fallback_cost_capacity_back += spend * span / 60.0

    def report(self, out: RegionRun) -> None:
        super().report(out)
        self._accrue_fallback(self.cfg.minutes)
        out.lifecycle = {
            "fallback_cost": round(out.cost_committed.get("fallback", 0.0), 4),
            "fallback_cost_capacity_back": round(self.fallback_cost_capacity_back, 4),
        }


@dataclass
class _Pending:
    due: int
    tenant: int
    units: int  # the replacement's
    reason: DisruptionReason
    old: list[tuple[str, int, str]]  # ("r" | "c", pool, hall)


@dataclass
class _Counts:
    disruptions: dict[str, int] = field(default_factory=dict)
    replacements: int = 0
    lost_unit_hours: float = 0.0
    lost_minutes: float = 0.0


class ScoLifecycle(ScoToday):
    """Today's controller plus the lifecycle workflow's rounds on the controller's tick."""

    name = "sco-lifecycle"
    consolidating: ClassVar[bool] = True
    anti_churn: ClassVar[AntiChurn] = AntiChurn()
    budgets: ClassVar[Disruption | None] = None  # None: each contract's own

    def __init__(self, fleet: Fleet, cfg: EstateConfig, trace: RegionTrace) -> None:
        super().__init__(fleet, cfg, trace)
        self.pending: list[_Pending] = []
        self.born: dict[tuple[int, int], list[int]] = {}  # (pool, tenant) -> launch minutes
        self.leaving_r: dict[tuple[int, int], int] = {}  # (pool, tenant) -> old, going
        self.leaving_c: dict[tuple[int, int], int] = {}  # (pool, tenant) -> old fallback
        self.free_streak: dict[str, int] = {}
        self.consolidation_streak: dict[str, int] = {}
        self.counts = _Counts()
        self.lead = float(fleet.region.notice_lead_seconds)
        self.lead_minutes = math.ceil(self.lead / 60.0)
        self.rng = random.Random(f"{cfg.seed}:{fleet.region.id}:lifecycle")
        self.anti = self.anti_churn.model_copy(update={"consolidate": self.consolidating})
        self.contracts = [
            t.contract.model_copy(
                update={"name": t.name}
                | ({"disruption": self.budgets} if self.budgets is not None else {})
            )
            for t in fleet.tenants
        ]

    def step(self, minute: int, targets: Sequence[int]) -> None:
        self._finish(minute)
        super().step(minute, targets)
        self._round(minute, targets)

    # -- a round ------------------------------------------------------------------------

    def _ages(self, pool: int, t: int, n: int, minute: int) -> list[int]:
        """Launch minutes of the tenant's n instances in the pool, oldest first (a launch
        is dated at the first round that sees it; a loss takes the oldest)."""
        born = self.born.setdefault((pool, t), [])
        if len(born) < n:
            born.extend([minute] * (n - len(born)))
        elif len(born) > n:
            del born[: len(born) - n]
        return born

    def _views(self, minute: int, targets: Sequence[int]) -> list[ContractLife]:
        fleet, cfg = self.fleet, self.cfg
        excluded = self.cycles.excluded() if self.excluding else set()
        # The spread groups as the estate's planner (estate.sco) keeps to them.
        wanted = [max(0, targets[t] - ten.floor_units) for t, ten in enumerate(fleet.tenants)]
        groups = spread_rooms(
            [
                SpreadMember(
                    groups=list(ten.demand.spread_groups),
                    target_units=min(wanted[t], ten.demand.max_units_per_region),
                    used={
                        fleet.region.pool_id(fleet.pools[p]): h[t] * ten.upi[p]
                        for p, h in enumerate(fleet.held)
                        if h.get(t)
                    },
                )
                for t, ten in enumerate(fleet.tenants)
            ],
            SPREAD_MAX_POOL_FRACTION,
        )
        views = []
        for t, tenant in enumerate(fleet.tenants):
            name = tenant.name
            instances: list[LifeInstance] = []
            for p in tenant.allowed:
                n = fleet.held[p].get(t, 0)
                born = self._ages(p, t, n, minute)
                if not n:
                    continue
                pool = fleet.pools[p]
                booting = fleet.booting.get((p, t), 0)
                skip = self.leaving_r.get((p, t), 0)  # the oldest are going
                for k in range(skip, n):
                    instances.append(
                        LifeInstance(
                            instance_id=f"r:{p}:{t}:{k}",
                            region=fleet.region.id,
                            workload=name,
                            pool_id=fleet.region.pool_id(pool),
                            hall=pool.hall,
                            sku=pool.sku,
                            size=pool.size,
                            state="active" if k < n - booting else "requested",
                            created_at=_at(born[k]),
                            price_per_hour=fleet.price[p],
                            units=tenant.upi[p],
                        )
                    )
            seen: dict[int, int] = {}
            for g in fleet.committed:
                if g.tenant != t or g.role != "fallback":
                    continue
                pool = fleet.pools[g.pool]
                for _ in range(g.count):
                    k = seen[g.pool] = seen.get(g.pool, 0) + 1
                    if k <= self.leaving_c.get((g.pool, t), 0):
                        continue
                    instances.append(
                        LifeInstance(
                            instance_id=f"c:{g.pool}:{t}:{k}",
                            region=fleet.region.id,
                            workload=name,
                            pool_id=fleet.region.pool_id(pool),
                            hall=g.hall,
                            sku=pool.sku,
                            size=pool.size,
                            state="active" if g.ready <= minute else "requested",
                            committed=True,
                            fallback=True,
                            created_at=_at(g.ready - cfg.committed_boot_minutes),
                            price_per_hour=g.price,
                            units=tenant.upi[g.pool],
                        )
                    )
            if not instances:
                continue
            pools = []
            for p in tenant.allowed:
                pool = fleet.pools[p]
                out = p in excluded or pool.hall in fleet.down
                pools.append(
                    LifePool(
                        pool_id=fleet.region.pool_id(pool),
                        hall=pool.hall,
                        flavor=f"{pool.sku}.{pool.size}",
                        price_per_hour=fleet.price[p],
                        units=tenant.upi[p],
                        free=0 if out else fleet.free(p, minute, cfg.reclaim_hold_minutes),
                        excluded=out,
                        share_cap=pool_share_cap(
                            tenant.demand.max_pool_share, pool.reclaimable_units
                        ),
                    )
                )
            views.append(
                ContractLife(
                    contract=self.contracts[t],
                    tier=tenant.contract.tier,
                    demand_units=wanted[t],
                    instances=instances,
                    pools=pools,
                    spread=[groups[g] for g in sorted(set(tenant.demand.spread_groups))],
                )
            )
        return views

    def _round(self, minute: int, targets: Sequence[int]) -> None:
        fleet = self.fleet
        views = self._views(minute, targets)
        if not views:
            return
        self.free_streak = next_streak(self.free_streak, views)
        in_flight: dict[str, dict[DisruptionReason, int]] = {}
        for job in self.pending:
            by = in_flight.setdefault(fleet.tenants[job.tenant].name, {})
            by[job.reason] = by.get(job.reason, 0) + len(job.old)
        plan = plan_lifecycle(
            views,
            now=_at(minute),
            free_streak=self.free_streak,
            in_flight=in_flight,
            anti_churn=self.anti,
            consolidation_streak=self.consolidation_streak,
        )
        self.consolidation_streak = next_consolidation_streak(self.consolidation_streak, plan)
        by_name = {ten.name: t for t, ten in enumerate(fleet.tenants)}
        for r in plan.replace:
            self._start(by_name[r.contract], r, minute)

    def _start(self, t: int, r: Replacement, minute: int) -> None:
        fleet = self.fleet
        units = 0
        for part in r.parts:  # every piece of a return from fallback in smaller instances
            target = self.index[part.pool_id]
            fleet.launch(target, t, 1, minute, self.cfg.boot_minutes)
            units += fleet.tenants[t].upi[target]
        self.pending_units[t] += units
        old: list[tuple[str, int, str]] = []
        for iid in r.replaced:
            kind, pool_s, _, _ = iid.split(":")
            pool = int(pool_s)
            key = (pool, t)
            if kind == "r":
                self.leaving_r[key] = self.leaving_r.get(key, 0) + 1
            else:
                self.leaving_c[key] = self.leaving_c.get(key, 0) + 1
            old.append((kind, pool, fleet.pools[pool].hall))
        due = minute + self.cfg.boot_minutes + self.lead_minutes
        self.pending.append(_Pending(due, t, units, r.reason, old))

    def _finish(self, minute: int) -> None:
        """Replacements whose old instances have drained: they go now."""
        fleet, counts = self.fleet, self.counts
        keep: list[_Pending] = []
        for job in self.pending:
            if job.due > minute:
                keep.append(job)
                continue
            t = job.tenant
            tenant = fleet.tenants[t]
            self.pending_units[t] -= job.units
            counts.replacements += 1
            for kind, pool, _hall in job.old:
                key = (pool, t)
                gone = 0
                if kind == "r":
                    self.leaving_r[key] -= 1
                    gone = fleet.remove(pool, t, 1, minute)
                    born = self.born.get(key)
                    if gone and born:
                        born.pop(0)
                else:
                    self.leaving_c[key] -= 1
                    for g in fleet.committed:
                        if g.tenant == t and g.role == "fallback" and g.pool == pool:
                            fleet.uncommit(g, 1)
                            gone = 1
                            break
                if not gone:
                    continue  # reclaimed or released meanwhile: nothing to disrupt
                reason = job.reason.value
                counts.disruptions[reason] = counts.disruptions.get(reason, 0) + 1
                lost = lost_minutes(
                    tenant.kind, self.rng.random(), self.cfg, lead_seconds=self.lead
                )
                counts.lost_minutes += lost
                counts.lost_unit_hours += lost * tenant.upi[pool] / 60.0
        self.pending = keep

    def report(self, out: RegionRun) -> None:
        super().report(out)
        c = self.counts
        out.lifecycle |= {
            "voluntary_disruptions": float(sum(c.disruptions.values())),
            **{f"disruptions_{k}": float(v) for k, v in sorted(c.disruptions.items())},
            "replacements": float(c.replacements),
            "voluntary_lost_unit_hours": round(c.lost_unit_hours, 4),
            "voluntary_lost_minutes": round(c.lost_minutes, 3),
        }


class ScoReturn(ScoLifecycle):
    """Return from fallback alone (no consolidation): what returning saves by itself."""

    name = "sco-return"
    consolidating = False


class KarpenterConsolidation(ScoLifecycle):
    """Karpenter's WhenEmptyOrUnderutilized, consolidateAfter 0, no budgets."""

    name = "karpenter-consolidation"
    anti_churn = KARPENTER_ANTI_CHURN
    budgets = NO_BUDGETS


#: The lifecycle comparison's policies, in report order.
LIFECYCLE_POLICIES: tuple[type[ScoToday], ...] = (
    ScoToday,
    ScoReturn,
    ScoLifecycle,
    KarpenterConsolidation,
)
