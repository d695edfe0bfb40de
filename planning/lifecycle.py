"""Voluntary replacements of one region's instances, within budget and without churn (pure).

The lifecycle workflow (workflows/lifecycle/) asks this each round with a snapshot; it
answers which instances to replace now, where the replacement goes, and which candidates
are held back and why. Reasons, in the order they are considered (an instance is
disrupted for one reason only):

- drift: the instance no longer conforms to its contract (planning/drift.py);
- return from fallback: a committed fallback instance (bought by the controller when
  reclaimable capacity ran out) whose contract's allowed reclaimable pools have free
  capacity again: a reclaimable replacement stops the fallback spend. When no allowed
  pool has a free instance as large as the old one, several smaller ones (at most
  `max_return_parts`, the cheapest set that covers its units) replace it: reclaimable
  capacity often comes back in smaller pieces first, and waiting for the one large shape
  kept the fallback spend running (decision 0031);
- expiry: older than the contract's `max_instance_age_hours` (planning/voluntary.py);
- consolidation: one or two of the contract's reclaimable instances replaced by one
  instance that costs less by a margin, when what the contract then holds still covers
  its demand (SCO's own view: the units per instance and the schedulers' demand). Instances
  a plain release would remove (the contract holds more than demand without them) are the
  controller's surplus release, not a consolidation. Two instances replaced by one are
  drained one after the other, so a consolidation disrupts one instance at a time.

Every replacement is make-before-break (the workflow launches it, every part of it, first),
so a candidate with no allowed pool that has room (within the contract's `max_pool_share`
of it) and covers at least the old instance's units (alone, or for a return from fallback
in parts) is held back, never broken. Each reason goes
through `allowed_disruptions` (the contract's disruption budget and blackouts).
Anti-churn for return from fallback: the instance is at least `min_age_seconds` old, the
target pool has shown free capacity on `stable_rounds` rounds in a row (hysteresis: a
pool flickering free is never chased), and the replacement saves at least
`min_saving_per_hour`. Consolidation: instances at least `min_age_seconds`
old, a target pool stable the same way, a saving of at least `min_saving_per_hour` and
`consolidation_margin` of what the replaced instances cost, and the same opportunity found
on `stable_rounds` rounds in a row; at most one consolidation per contract per round.
Drift and expiry are not held by age or saving: the contract asked for them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from contracts.disruption import DisruptionReason
from contracts.model import Contract
from planning.disruption_budget import BudgetVerdict, allowed_disruptions
from planning.drift import fleet_drift, is_serving
from planning.voluntary import expired


class LifeInstance(BaseModel):
    """One of a contract's live instances in the region (drift reads the placement fields;
    `units`: demand units it carries for its contract's current unit shape)."""

    instance_id: str
    region: str
    workload: str
    pool_id: str
    hall: str
    sku: str
    size: str
    state: str = "active"
    committed: bool = False
    # A committed instance the region controller bought as fallback (not a floor's).
    fallback: bool = False
    created_at: datetime
    price_per_hour: float = 0.0
    units: int = 1
    provider_id: str | None = None


class LifePool(BaseModel):
    """A reclaimable pool the contract's placement allows in the region."""

    pool_id: str
    hall: str
    flavor: str
    price_per_hour: float
    units: int = Field(ge=0)  # units one instance carries for the contract
    free: int = Field(default=0, ge=0)  # instances that can start there now
    excluded: bool = False
    # The most instances the contract may hold in the pool (placement.max_pool_share of
    # what it lends, planning/costs.pool_share_cap); None: no cap.
    share_cap: int | None = Field(default=None, ge=0)


class ContractLife(BaseModel):
    contract: Contract
    tier: int = 3
    # Demand units the schedulers and operators ask of the contract in the region; None:
    # not known (no consolidation then).
    demand_units: int | None = None
    instances: list[LifeInstance] = []
    pools: list[LifePool] = []


class AntiChurn(BaseModel):
    min_age_seconds: float = Field(default=3600.0, ge=0)
    stable_rounds: int = Field(default=2, ge=1)
    min_saving_per_hour: float = Field(default=0.0, ge=0)
    # Consolidation: on or off, and the least saving as a share of the replaced cost.
    consolidate: bool = True
    consolidation_margin: float = Field(default=0.1, ge=0, le=1)
    # Return from fallback: the most reclaimable instances one fallback instance may be
    # replaced by when no single one as large is free (1: one for one only).
    max_return_parts: int = Field(default=4, ge=1)


class ReplacementPart(BaseModel):
    """One reclaimable instance of a replacement made of several."""

    model_config = ConfigDict(frozen=True)

    pool_id: str
    hall: str
    flavor: str
    units: int
    price_per_hour: float


class Replacement(BaseModel):
    model_config = ConfigDict(frozen=True)

    contract: str
    instance_id: str  # the instance to replace
    reason: DisruptionReason
    why: str
    pool_id: str  # where its replacement starts
    hall: str
    flavor: str
    units: int
    old_price_per_hour: float
    new_price_per_hour: float
    # Consolidation only: more instances the one replacement stands in for (drained and
    # deleted after `instance_id`, one at a time); their prices are in old_price_per_hour.
    also: tuple[str, ...] = ()
    # Return from fallback only: more reclaimable instances launched beside the first
    # (pool_id, flavor, units), all ACTIVE before the old instance is drained; their
    # prices are in new_price_per_hour.
    more: tuple[ReplacementPart, ...] = ()

    @property
    def replaced(self) -> tuple[str, ...]:
        return (self.instance_id, *self.also)

    @property
    def parts(self) -> tuple[ReplacementPart, ...]:
        """Every instance the replacement launches, the first included."""
        first = ReplacementPart(
            pool_id=self.pool_id,
            hall=self.hall,
            flavor=self.flavor,
            units=self.units,
            price_per_hour=self.new_price_per_hour - sum(p.price_per_hour for p in self.more),
        )
        return (first, *self.more)

    @property
    def new_units(self) -> int:
        return sum(p.units for p in self.parts)

    @property
    def saving_per_hour(self) -> float:
        return self.old_price_per_hour - self.new_price_per_hour


class Held(BaseModel):
    model_config = ConfigDict(frozen=True)

    contract: str
    instance_id: str
    reason: DisruptionReason
    why: str


class LifecyclePlan(BaseModel):
    replace: list[Replacement] = []
    held: list[Held] = []
    verdicts: dict[str, list[BudgetVerdict]] = {}  # contract -> the verdicts it met
    # Contracts where a consolidation was found this round (held or not): the caller counts
    # the rounds in a row (hysteresis, `next_consolidation_streak`).
    consolidable: list[str] = []


class _Candidate(BaseModel):
    instance: LifeInstance
    reason: DisruptionReason
    why: str


def _usable(
    p: LifePool,
    room: Mapping[str, int],
    share: Mapping[str, int],
    streak: Mapping[str, int] | None,
    stable_rounds: int,
) -> bool:
    """An allowed pool with room now, within the contract's pool share (and, given a
    streak, free on `stable_rounds` rounds in a row)."""
    return (
        not p.excluded
        and room.get(p.pool_id, 0) > 0
        and (p.pool_id not in share or share[p.pool_id] > 0)
        and (streak is None or streak.get(p.pool_id, 0) >= stable_rounds)
    )


def _target(
    pools: Sequence[LifePool],
    room: Mapping[str, int],
    units: int,
    *,
    share: Mapping[str, int],
    streak: Mapping[str, int] | None = None,
    stable_rounds: int = 1,
) -> LifePool | None:
    """The cheapest allowed pool with room, within the contract's pool share, whose
    instance covers at least `units`."""
    fits = [
        p
        for p in pools
        if p.units >= max(units, 1) and _usable(p, room, share, streak, stable_rounds)
    ]
    return min(fits, key=lambda p: (p.price_per_hour, p.pool_id), default=None)


#: (cost, instances, pool ids, pools) of a set of smaller instances.
_PartSet = tuple[float, int, tuple[str, ...], tuple[LifePool, ...]]


def _return_pools(
    pools: Sequence[LifePool],
    room: Mapping[str, int],
    units: int,
    *,
    share: Mapping[str, int],
    streak: Mapping[str, int] | None,
    stable_rounds: int,
    max_parts: int,
) -> tuple[LifePool, ...] | None:
    """Where a replacement of `units` starts: one instance as large if a usable pool has
    one (fewer launches, fewer drains to go wrong), else the cheapest two to `max_parts`
    smaller instances of usable pools that together cover `units` (ties: fewer
    instances, then pool ids); None: neither.

    The smaller ones by a bounded knapsack over the units covered (capped at `units`):
    each pool gives at most the instances its room and the contract's share allow."""
    one = _target(pools, room, units, share=share, streak=streak, stable_rounds=stable_rounds)
    if one is not None:
        return (one,)
    if max_parts < 2 or units < 2:
        return None
    smaller = sorted(
        (
            p
            for p in pools
            if 0 < p.units < units and _usable(p, room, share, streak, stable_rounds)
        ),
        key=lambda p: (p.price_per_hour, p.pool_id),
    )
    # covered units -> the best set found so far that covers them
    best: dict[int, _PartSet] = {0: (0.0, 0, (), ())}
    for p in smaller:
        limit = min(room.get(p.pool_id, 0), share.get(p.pool_id, max_parts), -(-units // p.units))
        grown = dict(best)
        for covered, (cost, n, ids, picked) in best.items():
            for k in range(1, min(limit, max_parts - n) + 1):
                got = min(units, covered + k * p.units)
                cand: _PartSet = (
                    cost + k * p.price_per_hour,
                    n + k,
                    ids + (p.pool_id,) * k,
                    picked + (p,) * k,
                )
                if got not in grown or cand[:3] < grown[got][:3]:
                    grown[got] = cand
        best = grown
    found = best.get(units)
    return found[3] if found is not None and found[1] >= 2 else None


def _share_room(view: ContractLife) -> dict[str, int]:
    """Per capped pool, how many more instances the contract may hold there."""
    held: dict[str, int] = {}
    for i in view.instances:
        if is_serving(i):
            held[i.pool_id] = held.get(i.pool_id, 0) + 1
    return {
        p.pool_id: p.share_cap - held.get(p.pool_id, 0)
        for p in view.pools
        if p.share_cap is not None
    }


def _candidates(view: ContractLife, now: datetime) -> list[_Candidate]:
    contract = view.contract
    # Only ACTIVE instances: one still booting has no node to drain yet (next round).
    serving = [i for i in view.instances if i.state == "active" and i.workload == contract.name]
    out: list[_Candidate] = []
    drift = fleet_drift([contract], serving)
    for inst in sorted(serving, key=lambda i: i.instance_id):
        verdict = drift.get(inst.instance_id)
        if verdict is not None and verdict.drifted:
            out.append(_Candidate(instance=inst, reason=DisruptionReason.DRIFT, why=verdict.why))
    taken = {c.instance.instance_id for c in out}
    for inst in sorted(serving, key=lambda i: (i.created_at, i.instance_id)):
        if inst.fallback and inst.state == "active" and inst.instance_id not in taken:
            out.append(
                _Candidate(
                    instance=inst,
                    reason=DisruptionReason.RETURN_FROM_FALLBACK,
                    why=f"fallback in {inst.pool_id} at {inst.price_per_hour:.3f}/h",
                )
            )
            taken.add(inst.instance_id)
    by_id = {i.instance_id: i for i in serving}
    for old, age in expired(contract, serving, now):
        if old.instance_id not in taken:
            hours = age.total_seconds() / 3600
            out.append(
                _Candidate(
                    instance=by_id[old.instance_id],
                    reason=DisruptionReason.EXPIRY,
                    why=f"{hours:.1f} h old, over max_instance_age_hours",
                )
            )
    return out


def plan_lifecycle(
    views: Sequence[ContractLife],
    *,
    now: datetime,
    free_streak: Mapping[str, int],
    in_flight: Mapping[str, Mapping[DisruptionReason, int]] | None = None,
    paused: Collection[str] = (),
    anti_churn: AntiChurn = AntiChurn(),
    consolidation_streak: Mapping[str, int] | None = None,
    undrainable: Collection[str] = (),
) -> LifecyclePlan:
    """What to replace now in one region.

    `free_streak`: per pool id, the rounds in a row it has shown free capacity (this one
    included); `in_flight`: voluntary disruptions already under way per contract and
    reason; `paused`: contracts an operator paused (every candidate held);
    `consolidation_streak`: per contract, the rounds in a row before this one that found a
    consolidation (`next_consolidation_streak`); `undrainable`: halls where a drain could
    not be told lately (no relay answered): their instances wait, no replacement is
    booted only to be released again."""
    plan = LifecyclePlan()
    busy_all = in_flight or {}
    room: dict[str, int] = {}
    for view in views:
        for p in view.pools:
            room[p.pool_id] = min(room.get(p.pool_id, p.free), p.free)
    min_age = timedelta(seconds=anti_churn.min_age_seconds)
    for view in sorted(views, key=lambda v: v.contract.name):
        name = view.contract.name
        candidates = _candidates(view, now)
        if name in paused:
            plan.held += [
                Held(
                    contract=name, instance_id=c.instance.instance_id, reason=c.reason, why="paused"
                )
                for c in candidates
            ]
            continue
        serving = sum(1 for i in view.instances if is_serving(i))
        share = _share_room(view)
        busy = dict(busy_all.get(name, {}))
        verdicts: dict[DisruptionReason, BudgetVerdict] = {}
        for c in candidates:
            inst = c.instance
            hold = _anti_churn(c, now, min_age, anti_churn)
            if inst.hall in undrainable:
                hold = f"no drain can be told in hall {inst.hall} lately (no relay answered)"
            targets: tuple[LifePool, ...] | None = None
            if hold is None:
                fallback = c.reason is DisruptionReason.RETURN_FROM_FALLBACK
                parts = anti_churn.max_return_parts if fallback else 1
                targets = _return_pools(
                    view.pools,
                    room,
                    inst.units,
                    share=share,
                    streak=free_streak if fallback else None,
                    stable_rounds=anti_churn.stable_rounds,
                    max_parts=parts,
                )
                if targets is None:
                    near = (
                        _return_pools(
                            view.pools,
                            room,
                            inst.units,
                            share=share,
                            streak=None,
                            stable_rounds=1,
                            max_parts=parts,
                        )
                        if fallback
                        else None
                    )
                    hold = (
                        _unstable(near, free_streak, anti_churn.stable_rounds)
                        if near is not None
                        else f"no allowed reclaimable pool has room for {inst.units} unit(s)"
                    )
                else:
                    saving = inst.price_per_hour - sum(p.price_per_hour for p in targets)
                    if fallback and (
                        saving < anti_churn.min_saving_per_hour
                        or (len(targets) > 1 and saving <= 0)
                    ):
                        hold = (
                            f"saves {saving:.3f}/h, under "
                            f"min_saving_per_hour {anti_churn.min_saving_per_hour:g}"
                        )
            if hold is not None or targets is None:
                plan.held.append(
                    Held(
                        contract=name, instance_id=inst.instance_id, reason=c.reason, why=hold or ""
                    )
                )
                continue
            v = allowed_disruptions(
                view.contract.disruption, c.reason, now=now, instances=serving, in_flight=busy
            )
            verdicts[c.reason] = v
            if v.allowed is not None and v.allowed <= 0:
                plan.held.append(
                    Held(contract=name, instance_id=inst.instance_id, reason=c.reason, why=v.why)
                )
                continue
            busy[c.reason] = busy.get(c.reason, 0) + 1
            for target in targets:
                room[target.pool_id] = room.get(target.pool_id, 0) - 1
                if target.pool_id in share:  # a capped pool
                    share[target.pool_id] -= 1
            plan.replace.append(_replacement(name, inst, c, targets))
        if anti_churn.consolidate:
            taken = {c.instance.instance_id for c in candidates}
            taken |= {i.instance_id for i in view.instances if i.hall in undrainable}
            _consolidate(
                plan,
                view,
                room,
                share,
                free_streak,
                taken,
                now=now,
                busy=busy,
                serving=serving,
                verdicts=verdicts,
                streak=(consolidation_streak or {}).get(name, 0),
                anti_churn=anti_churn,
            )
        if verdicts:
            plan.verdicts[name] = [verdicts[r] for r in sorted(verdicts)]
    return plan


def _unstable(near: Sequence[LifePool], free_streak: Mapping[str, int], stable_rounds: int) -> str:
    ids = list(dict.fromkeys(p.pool_id for p in near))
    seen = min(free_streak.get(pid, 0) for pid in ids)
    return (
        f"free capacity in {', '.join(ids)} seen on {seen} of {stable_rounds} "
        "rounds in a row (hysteresis)"
    )


def _replacement(
    name: str, inst: LifeInstance, c: _Candidate, targets: Sequence[LifePool]
) -> Replacement:
    """`inst` replaced by the instances of `targets` (one, or several smaller ones)."""
    first, *more = targets
    why = c.why
    if more:
        where = " + ".join(f"{p.flavor} in {p.pool_id}" for p in targets)
        why += (
            f"; as {len(targets)} smaller instances ({where}): no allowed pool has a free "
            f"instance of {inst.units} units"
        )
    return Replacement(
        contract=name,
        instance_id=inst.instance_id,
        reason=c.reason,
        why=why,
        pool_id=first.pool_id,
        hall=first.hall,
        flavor=first.flavor,
        units=first.units,
        old_price_per_hour=inst.price_per_hour,
        new_price_per_hour=sum(p.price_per_hour for p in targets),
        more=tuple(
            ReplacementPart(
                pool_id=p.pool_id,
                hall=p.hall,
                flavor=p.flavor,
                units=p.units,
                price_per_hour=p.price_per_hour,
            )
            for p in more
        ),
    )


#: Consolidation looks at this many of a contract's most expensive instances (pairs of them
#: grow with the square).
MAX_CONSOLIDATION_CANDIDATES = 32


class _Consolidation(BaseModel):
    group: tuple[LifeInstance, ...]
    target: LifePool
    cost: float
    need: int

    @property
    def saving(self) -> float:
        return self.cost - self.target.price_per_hour


def _best_consolidation(
    view: ContractLife,
    room: Mapping[str, int],
    share: Mapping[str, int],
    free_streak: Mapping[str, int],
    taken: Collection[str],
    now: datetime,
    anti_churn: AntiChurn,
) -> _Consolidation | None:
    demand = view.demand_units
    if demand is None or demand <= 0:
        return None  # nothing known to cover, or nothing to cover: the controller's call
    serving = [i for i in view.instances if is_serving(i)]
    held = sum(i.units for i in serving)
    min_age = timedelta(seconds=anti_churn.min_age_seconds)
    movable = sorted(
        (
            i
            for i in serving
            if i.state == "active"
            and not i.committed
            and i.instance_id not in taken
            and now - i.created_at >= min_age
        ),
        key=lambda i: (-i.price_per_hour, i.instance_id),
    )[:MAX_CONSOLIDATION_CANDIDATES]
    groups: list[tuple[LifeInstance, ...]] = [(a,) for a in movable]
    groups += [(a, b) for n, a in enumerate(movable) for b in movable[n + 1 :]]
    best: _Consolidation | None = None
    best_key: tuple[float, int, tuple[str, ...]] | None = None
    for group in groups:
        # One the contract can do without is the controller's surplus release.
        if any(held - i.units >= demand for i in group):
            continue
        need = demand - (held - sum(i.units for i in group))
        target = _target(
            view.pools,
            room,
            need,
            share=share,
            streak=free_streak,
            stable_rounds=anti_churn.stable_rounds,
        )
        if target is None:
            continue
        cost = sum(i.price_per_hour for i in group)
        saving = cost - target.price_per_hour
        if (
            saving <= 0
            or saving < anti_churn.min_saving_per_hour
            or saving < anti_churn.consolidation_margin * cost
        ):
            continue
        key = (-saving, len(group), tuple(i.instance_id for i in group))
        if best_key is None or key < best_key:
            best_key = key
            # A model only for the best so far: validating one per pair costs milliseconds.
            best = _Consolidation.model_construct(group=group, target=target, cost=cost, need=need)
    return best


def _consolidate(
    plan: LifecyclePlan,
    view: ContractLife,
    room: dict[str, int],
    share: dict[str, int],
    free_streak: Mapping[str, int],
    taken: Collection[str],
    *,
    now: datetime,
    busy: dict[DisruptionReason, int],
    serving: int,
    verdicts: dict[DisruptionReason, BudgetVerdict],
    streak: int,
    anti_churn: AntiChurn,
) -> None:
    """At most one consolidation for the contract this round, if one is found, stable and
    within budget (else held, with why)."""
    found = _best_consolidation(view, room, share, free_streak, taken, now, anti_churn)
    if found is None:
        return
    name = view.contract.name
    reason = DisruptionReason.CONSOLIDATION
    first = found.group[0].instance_id
    plan.consolidable.append(name)
    ids = ", ".join(i.instance_id for i in found.group)
    why = (
        f"{ids} ({sum(i.units for i in found.group)} units, {found.cost:.3f}/h) -> one "
        f"{found.target.flavor} in {found.target.pool_id} ({found.target.units} units, "
        f"{found.target.price_per_hour:.3f}/h) still covers demand {view.demand_units}"
    )
    if streak + 1 < anti_churn.stable_rounds:
        plan.held.append(
            Held(
                contract=name,
                instance_id=first,
                reason=reason,
                why=f"found on {streak + 1} of {anti_churn.stable_rounds} rounds in a row "
                "(hysteresis)",
            )
        )
        return
    v = allowed_disruptions(
        view.contract.disruption, reason, now=now, instances=serving, in_flight=busy
    )
    verdicts[reason] = v
    if v.allowed is not None and v.allowed <= 0:
        plan.held.append(Held(contract=name, instance_id=first, reason=reason, why=v.why))
        return
    busy[reason] = busy.get(reason, 0) + 1
    room[found.target.pool_id] = room.get(found.target.pool_id, 0) - 1
    if found.target.pool_id in share:  # a capped pool
        share[found.target.pool_id] -= 1
    plan.replace.append(
        Replacement(
            contract=name,
            instance_id=first,
            also=tuple(i.instance_id for i in found.group[1:]),
            reason=reason,
            why=why,
            pool_id=found.target.pool_id,
            hall=found.target.hall,
            flavor=found.target.flavor,
            units=found.target.units,
            old_price_per_hour=found.cost,
            new_price_per_hour=found.target.price_per_hour,
        )
    )


def next_consolidation_streak(previous: Mapping[str, int], plan: LifecyclePlan) -> dict[str, int]:
    """Per contract, the rounds in a row that found a consolidation, this one included."""
    return {c: previous.get(c, 0) + 1 for c in sorted(set(plan.consolidable))}


def _anti_churn(
    c: _Candidate, now: datetime, min_age: timedelta, anti_churn: AntiChurn
) -> str | None:
    if c.reason is not DisruptionReason.RETURN_FROM_FALLBACK:
        return None
    age = now - c.instance.created_at
    if age < min_age:
        return (
            f"{age.total_seconds():.0f} s old, under min_age_seconds {anti_churn.min_age_seconds:g}"
        )
    return None


def next_streak(previous: Mapping[str, int], views: Sequence[ContractLife]) -> dict[str, int]:
    """Each pool's run of rounds with free capacity, counting this snapshot (a pool
    without free capacity now is left out: its run starts again)."""
    free: dict[str, int] = {}
    for view in views:
        for p in view.pools:
            free[p.pool_id] = min(free.get(p.pool_id, p.free), p.free)
    return {pid: previous.get(pid, 0) + 1 for pid, n in sorted(free.items()) if n > 0}
