"""SCO's policies on the simulated fleet: the planner (risk-priced by each pool's observed
reclaim rate, excluded pools left out), the fallback arbiter within each contract's spend
authority, the exclusion cycle, and floor keepers on committed capacity.

Tier-1 floors are held by a keeper each (committed, spread by planning.floor_spread); the
planner covers only demand above the floor. A hall loss is detected, not read: each
keeper's probes (estate.halls, the product's rule planning.hall_probe) compare the floor
instances it holds by its own record with what the provider answers, so a loss is seen a
probe or more late, a stale answer delays it and a provider glitch can raise a false
alarm. On a verdict the keeper re-spreads the floor over the halls it holds healthy, and
when a hall is judged back it moves back make-before-break: launch first, release the
surplus once the new instances are up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from estate import fallback
from estate.baselines import pool_index
from estate.config import EstateConfig
from estate.exclusion import PoolCycles
from estate.fallback import FallbackLog
from estate.fleet import Committed, Fleet, ceil_div, cheapest_committed_shape, shape_pools
from estate.halls import HallWatch, watch
from estate.policy import PolicyBase
from estate.results import ExclusionResult, FallbackResult, HallDetection, RegionRun
from estate.trace import RegionTrace
from planning.floor_spread import spread
from planning.models import PlanInput, PoolInput, pool_input, risk_cost
from planning.planner import plan


@dataclass
class FloorKeeper:
    tenant: int
    shape_pools: dict[str, int]  # hall -> pool index of the floor's shape
    instances: int
    units_per_instance: int
    watch: HallWatch
    record: dict[str, int]  # hall -> floor instances the keeper holds there, by its record


class Sco(PolicyBase):
    """SCO as it runs; the ablations below switch one of its parts off."""

    name = "sco"
    excluding: ClassVar[bool] = True
    """The exclusion cycle keeps pools out (off: every pool stays admitted)."""
    risk_pricing: ClassVar[bool] = True
    """The planner prices each pool by its observed reclaim rate (off: rate 0)."""
    spreading: ClassVar[bool] = True
    """Floors spread over halls, and each contract's pool share cap (off: one hall, no cap)."""

    def __init__(self, fleet: Fleet, cfg: EstateConfig, trace: RegionTrace) -> None:
        super().__init__(fleet, cfg, trace)
        if not self.spreading:
            for tenant in fleet.tenants:
                tenant.demand = tenant.demand.model_copy(update={"max_pool_share": 1.0})
        self.cycles = PoolCycles(len(fleet.pools), cfg, f"{cfg.seed}:{fleet.region.id}")
        self.notices_by_day: list[dict[int, int]] = [{} for _ in fleet.pools]
        self.index = pool_index(fleet)
        self.fallback = {t: FallbackLog() for t in range(len(fleet.tenants))}
        self.keepers: list[FloorKeeper] = []
        self.canary_minutes = 0
        self.exposed: set[int] = set()  # pools SCO ever held instances in (after a step)
        self.max_upi = [max(t.upi, default=1) for t in fleet.tenants]
        self._inputs: dict[tuple[int, int, float, bool, float], PoolInput] = {}
        for t, tenant in enumerate(fleet.tenants):
            shape = cheapest_committed_shape(fleet, tenant) if tenant.floor_units else None
            if shape is None:
                continue
            by_hall = shape_pools(fleet, tenant)[shape]
            per = tenant.upi[by_hall[min(by_hall)]]
            halls = sorted(h for h in by_hall if h in fleet.committed_rate)
            eye = watch(halls, sorted(fleet.region.halls), cfg, fleet.region.id, tenant.name)
            self.keepers.append(
                FloorKeeper(t, by_hall, ceil_div(tenant.floor_units, per), per, eye, {})
            )
        for k in self.keepers:  # built before the month starts
            self.keep(k, 0, boot=0)
        # The plotted floor: the largest keeper's.
        self.plotted = max(self.keepers, key=lambda k: (k.instances, -k.tenant), default=None)

    # -- floors ---------------------------------------------------------------------------

    def probe(self, minute: int) -> bool:
        """Each keeper's probes this minute; True when a verdict changed (plan now)."""
        changed = False
        for k in self.keepers:
            actual = self.floor_held(k)
            gone = {h: max(0, n - actual.get(h, 0)) for h, n in k.record.items()}
            lost, back = k.watch.minute(minute, k.record, gone, self.fleet.down)
            for hall in lost:
                # Judged lost: what is gone there is written off (the product releases it).
                k.record[hall] = actual.get(hall, 0)
            changed = changed or bool(lost or back)
        return changed

    def floor_held(self, k: FloorKeeper) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.fleet.committed:
            if g.tenant == k.tenant and g.role == "floor":
                out[g.hall] = out.get(g.hall, 0) + g.count
        return out

    def floor_ready(self, k: FloorKeeper, minute: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.fleet.committed:
            if g.tenant == k.tenant and g.role == "floor" and g.ready <= minute:
                out[g.hall] = out.get(g.hall, 0) + g.count
        return out

    def keep(self, k: FloorKeeper, minute: int, boot: int | None = None) -> None:
        fleet = self.fleet
        lost = k.watch.lost
        healthy = sorted(h for h in k.shape_pools if h in fleet.committed_rate and h not in lost)
        groups = [g for g in fleet.committed if g.tenant == k.tenant and g.role == "floor"]
        # What the keeper holds by its record: a hall's instances gone in a loss it has not
        # detected yet still count (it does not know).
        held: dict[str, int] = dict(k.record)
        rooms = {h: held.get(h, 0) + fleet.committed_room(h, k.shape_pools[h]) for h in healthy}
        targets = spread(k.instances, healthy, rooms).targets
        if not self.spreading:
            whole = [h for h in healthy if rooms[h] >= k.instances]
            if whole:
                targets = {h: (k.instances if h == whole[0] else 0) for h in healthy}
        for hall, want in sorted(targets.items()):
            if want > held.get(hall, 0):
                pool = k.shape_pools[hall]
                wait = self.cfg.committed_boot_minutes if boot is None else boot
                fleet.commit(
                    Committed(
                        tenant=k.tenant,
                        hall=hall,
                        pool=pool,
                        count=want - held.get(hall, 0),
                        price=fleet.committed_price(pool, hall),
                        ready=minute + wait,
                        role="floor",
                    )
                )
                k.record[hall] = want
        # Make-before-break: the surplus goes only once every target hall is up.
        ready = self.floor_ready(k, minute)
        if all(ready.get(h, 0) >= n for h, n in targets.items()):
            for g in list(reversed(groups)):
                extra = held.get(g.hall, 0) - targets.get(g.hall, 0)
                if extra > 0 and g in fleet.committed:
                    n = min(extra, g.count)
                    held[g.hall] -= n
                    k.record[g.hall] = held[g.hall]
                    fleet.uncommit(g, n)

    def keeper_units(self, k: FloorKeeper, minute: int) -> dict[str, int]:
        return {h: n * k.units_per_instance for h, n in self.floor_ready(k, minute).items()}

    def floor_units(self, tenant: int, minute: int) -> int:
        """What the tenant's keeper holds up (its floor is the keeper's alone)."""
        keeper = next(k for k in self.keepers if k.tenant == tenant)
        return sum(self.keeper_units(keeper, minute).values())

    def floor_by_hall(self, minute: int) -> dict[str, int] | None:
        return None if self.plotted is None else self.keeper_units(self.plotted, minute)

    # -- reclaims and the exclusion cycle -------------------------------------------------

    def on_hit(self, pool: int, slots: Sequence[int], minute: int) -> None:
        # A probing pool's canary sits in the slot after ours.
        if self.fleet.count(pool) in slots:
            self.cycles.canary_reclaimed(pool, minute)

    def on_reclaim(self, pool: int, instance_id: str, minute: int) -> None:
        day = self.notices_by_day[pool]
        day[minute // 1440] = day.get(minute // 1440, 0) + 1
        if self.excluding:
            self.cycles.notice(pool, instance_id, minute)

    # -- reclaimable and fallback ----------------------------------------------------------

    def step(self, minute: int, targets: Sequence[int]) -> None:
        self._plan(minute, targets)
        self.exposed.update(p for p, h in enumerate(self.fleet.held) if h)

    def _plan(self, minute: int, targets: Sequence[int]) -> None:
        fleet, cfg = self.fleet, self.cfg
        for k in self.keepers:
            self.keep(k, minute)
        for pool in self.cycles.tick(minute) if self.excluding else ():
            self.canary_minutes += cfg.probe_minutes
            fleet.cost_committed["canary"] = fleet.cost_committed.get("canary", 0.0) + (
                fleet.price[pool] * cfg.probe_minutes / 60.0
            )
        wanted = [max(0, targets[t] - fleet.tenants[t].floor_units) for t in range(len(targets))]
        if not any(g.role == "fallback" for g in fleet.committed) and all(
            0 <= fleet.held_units[t] - wanted[t] < self.max_upi[t] for t in range(len(wanted))
        ):
            return  # every contract holds its demand: the planner would plan nothing
        excluded = self.cycles.excluded() if self.excluding else set()
        rates = [
            fleet.rate(p, self.notices_by_day[p], minute, cfg.rate_window_days)
            if self.risk_pricing
            else 0.0
            for p in range(len(fleet.pools))
        ]
        pools = self.pool_inputs(minute, rates, excluded)
        demands = []
        for t, tenant in enumerate(fleet.tenants):
            existing = {
                fleet.region.pool_id(fleet.pools[p]): h[t]
                for p, h in enumerate(fleet.held)
                if t in h
            }
            demands.append(
                tenant.demand.model_copy(update={"demand_units": wanted[t], "existing": existing})
            )
        result = plan(PlanInput(contracts=demands, pools=pools))
        by_name = {tenant.name: t for t, tenant in enumerate(fleet.tenants)}
        for a in result.allocations:
            fleet.launch(
                self.index[a.pool_id], by_name[a.contract], a.instances, minute, cfg.boot_minutes
            )
        for o in result.outcomes:
            t = by_name[o.contract]
            if o.surplus_units:
                self.release_reclaimable(t, o.surplus_units, excluded, pools, minute)
            self.arbitrate(t, o.shortfall_units, pools, minute)

    def pool_inputs(self, minute: int, rates: list[float], excluded: set[int]) -> list[PoolInput]:
        """The planner's pools, each model built once per (free, rate, excluded): building
        144 validated models per tick would cost more than planning."""
        fleet, out = self.fleet, []
        for i, pool in enumerate(fleet.pools):
            key = (
                i,
                fleet.free(i, minute, self.cfg.reclaim_hold_minutes),
                rates[i],
                i in excluded or pool.hall in fleet.down,
                fleet.price[i],
            )
            inp = self._inputs.get(key)
            if inp is None:
                if len(self._inputs) > 100_000:
                    self._inputs.clear()
                inp = pool_input(
                    fleet.region,
                    pool,
                    free=key[1],
                    reclaim_rate=key[2],
                    excluded=key[3],
                    load=self.cfg.load_risk() if self.risk_pricing else None,
                )
                if key[4] != pool.price_per_hour:
                    inp = inp.model_copy(update={"price_per_hour": key[4]})
                self._inputs[key] = inp
            out.append(inp)
        return out

    def release_reclaimable(
        self, t: int, surplus: int, excluded: set[int], pools_in: list[PoolInput], minute: int
    ) -> None:
        """Excluded pools first, then the dearest risk-priced units (the planner's price)."""
        fleet = self.fleet
        tenant = fleet.tenants[t]
        pools = [p for p, h in enumerate(fleet.held) if t in h]
        kind = tenant.kind.value

        def dearest(p: int) -> tuple[bool, float, int]:
            cost = risk_cost(pools_in[p], kind) / tenant.upi[p]
            return (p not in excluded, -cost, p)

        for p in sorted(pools, key=dearest):
            upi = tenant.upi[p]
            if surplus < upi:
                continue
            n = min(surplus // upi, fleet.held[p].get(t, 0))
            surplus -= fleet.remove(p, t, n, minute) * upi

    def arbitrate(self, t: int, shortfall: int, pools: list[PoolInput], minute: int) -> None:
        fallback.arbitrate(
            self.fleet, self.cfg, t, shortfall, pools, self.index, minute, self.fallback[t]
        )

    def after_change(self, minute: int) -> None:
        """Fallback spend against authority, in every minute the fleet changed."""
        fallback.watch(self.fleet, self.fallback)

    # -- results --------------------------------------------------------------------------

    def report(self, out: RegionRun) -> None:
        fleet = self.fleet
        out.fallback = [
            FallbackResult(
                region=out.region,
                contract=fleet.tenants[t].name,
                authority_per_hour=fleet.tenants[t].authority,
                max_spend_per_hour=round(log.max_spend, 6),
                minutes_over=log.minutes_over,
                launched=log.launched,
                declined=log.declined,
                reasons=log.reasons,
            )
            for t, log in self.fallback.items()
        ]
        out.exclusion = self.exclusion_result() if self.excluding else None
        out.hall_detections = [
            HallDetection(
                contract=fleet.tenants[k.tenant].name,
                hall=d.hall,
                minute=d.minute,
                lost=d.lost,
                true_loss=d.true_loss,
            )
            for k in self.keepers
            for d in k.watch.detections
        ]
        if self.plotted is not None:
            out.floor_trace_contract = fleet.tenants[self.plotted.tenant].name

    def exclusion_result(self) -> ExclusionResult:
        ids = [self.fleet.region.pool_id(p) for p in self.fleet.pools]
        bad, cycles = self.trace.ever_bad(), self.cycles
        ever = [i for i, c in enumerate(cycles.pools) if c.timeline]
        return ExclusionResult(
            bad_pools=sorted(ids[i] for i in bad),
            excluded_pools=sorted(ids[i] for i in ever),
            bad_excluded=sorted(ids[i] for i in ever if i in bad),
            good_excluded=sorted(ids[i] for i in ever if i not in bad),
            exposed_good_pools=len(self.exposed - bad),
            probes=cycles.probes,
            excluded_minutes={ids[i]: cycles.excluded_minutes(i, self.cfg.minutes) for i in ever},
            timelines={ids[i]: cycles.pools[i].timeline for i in sorted(bad)},
        )


class ScoNoExclusion(Sco):
    name = "sco-no-exclusion"
    excluding = False


class ScoNoRisk(Sco):
    name = "sco-no-risk"
    risk_pricing = False


class ScoNoSpread(Sco):
    name = "sco-no-spread"
    spreading = False
