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
in parts) is held back, never broken. Every replacement also keeps to the contract's
spread groups as the controller's planner keeps its acquisitions to them (decision 0033):
the members of a group hold at most `planning/costs.spread_cap` units in one pool, the
replaced instances' units given back first, an instance counted for the units it covers
(partly used under a cap smaller than it, as the planner does); members share the room
within a round. A candidate only the spread rules out is held with a `spread: ...` why
naming the group, the pool, the units and the cap. Each reason goes
through `allowed_disruptions` (the contract's disruption budget and blackouts).
Anti-churn for return from fallback: the instance is at least `min_age_seconds` old, the
target pool has shown free capacity on `stable_rounds` rounds in a row (hysteresis: a
pool flickering free is never chased), and the replacement saves at least
`min_saving_per_hour`. Consolidation: instances at least `min_age_seconds`
old, a target pool stable the same way, a saving of at least `min_saving_per_hour` and
`consolidation_margin` of what the replaced instances cost, and the same opportunity found
on `consolidation_stable_rounds` rounds in a row; at most one consolidation per contract
per round.
Drift and expiry are not held by age or saving: the contract asked for them.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from contracts.disruption import DisruptionReason
from contracts.model import Contract
from planning.costs import spread_cap
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


class SpreadRoom(BaseModel):
    """One spread group of a contract, as the controller's planner applies it to
    acquisitions (planning/planner.py): the group's members together hold at most
    `cap_units` units in any one pool (planning/costs.spread_cap of `fraction` of the
    members' `target_units`); `used`: per pool, the units they hold there now (every unit
    of each live reclaimable instance, as the planner counts the instances held)."""

    group: str
    cap_units: int = Field(ge=0)
    fraction: float = Field(gt=0, le=1)  # control.spread_max_pool_fraction
    target_units: int = Field(ge=0)
    used: dict[str, int] = {}


class SpreadMember(BaseModel):
    """One contract's part in its spread groups: `target_units` (demand, capped by
    max_units_per_region) and, per pool, the units its reclaimable instances hold."""

    groups: list[str]
    target_units: int = Field(ge=0)
    used: dict[str, int] = {}


def spread_rooms(members: Sequence[SpreadMember], fraction: float) -> dict[str, SpreadRoom]:
    """Each spread group's cap and use per pool, from all of its members in the region:
    the planner's rule (planning/costs.spread_cap over the members' targets summed)."""
    totals: dict[str, int] = {}
    used: dict[str, dict[str, int]] = {}
    for m in members:
        for g in sorted(set(m.groups)):
            totals[g] = totals.get(g, 0) + m.target_units
            per_pool = used.setdefault(g, {})
            for pid, units in m.used.items():
                per_pool[pid] = per_pool.get(pid, 0) + units
    return {
        g: SpreadRoom(
            group=g,
            cap_units=spread_cap(fraction, total),
            fraction=fraction,
            target_units=total,
            used=dict(sorted(used[g].items())),
        )
        for g, total in sorted(totals.items())
    }


class ContractLife(BaseModel):
    contract: Contract
    tier: int = 3
    # Demand units the schedulers and operators ask of the contract in the region; None:
    # not known (no consolidation then).
    demand_units: int | None = None
    instances: list[LifeInstance] = []
    pools: list[LifePool] = []
    # The contract's spread groups (spread_rooms); empty: none, or a snapshot from before
    # replacements kept to them (its rounds replay as they were planned).
    spread: list[SpreadRoom] = []


class AntiChurn(BaseModel):
    min_age_seconds: float = Field(default=3600.0, ge=0)
    stable_rounds: int = Field(default=2, ge=1)
    min_saving_per_hour: float = Field(default=0.0, ge=0)
    # Consolidation: on or off, and the least saving as a share of the replaced cost.
    consolidate: bool = True
    consolidation_margin: float = Field(default=0.2, ge=0, le=1)
    # Return from fallback: the most reclaimable instances one fallback instance may be
    # replaced by when no single one as large is free (1: one for one only).
    max_return_parts: int = Field(default=4, ge=1)
    # Consolidation only: the same opportunity found on this many rounds in a row. Longer
    # than a return's: a consolidation answers a dip in demand, which mostly comes back
    # within the hour (decision 0039), while a fallback's spend runs every round.
    consolidation_stable_rounds: int = Field(default=12, ge=1)


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


def _spread_left(spread: Mapping[str, int] | None, pool_id: str) -> int | None:
    """Units the contract's spread groups may still add in the pool; None: no group."""
    return None if spread is None else spread.get(pool_id, 0)


def _target(
    pools: Sequence[LifePool],
    room: Mapping[str, int],
    units: int,
    *,
    share: Mapping[str, int],
    streak: Mapping[str, int] | None = None,
    stable_rounds: int = 1,
    spread: Mapping[str, int] | None = None,
    freed: Mapping[str, int] | None = None,
) -> LifePool | None:
    """The cheapest allowed pool with room, within the contract's pool share and its
    spread groups' room (`spread`: units they may add per pool, plus `freed` there;
    None: no group), whose instance covers at least `units`."""
    need = max(units, 1)
    fits = [
        p
        for p in pools
        if p.units >= need
        and _usable(p, room, share, streak, stable_rounds)
        and (
            spread is None
            or spread.get(p.pool_id, 0) + (freed.get(p.pool_id, 0) if freed else 0) >= need
        )
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
    spread: Mapping[str, int] | None = None,
) -> tuple[LifePool, ...] | None:
    """Where a replacement of `units` starts: one instance as large if a usable pool has
    one (fewer launches, fewer drains to go wrong), else the cheapest two to `max_parts`
    instances of usable pools that together cover `units` (ties: fewer instances, then
    pool ids); None: neither.

    The pieces by a bounded knapsack over the units covered (capped at `units`): each
    pool gives at most the instances its room and the contract's share allow. With
    spread groups (`spread`: the units they may still add per pool), a pool's instances
    cover at most that many units, as the planner counts an instance its spread cap
    leaves partly used; a pool that may add none gives nothing."""
    one = _target(
        pools,
        room,
        units,
        share=share,
        streak=streak,
        stable_rounds=stable_rounds,
        spread=spread,
    )
    if one is not None:
        return (one,)
    if max_parts < 2 or units < 2:
        return None
    # Without spread groups only smaller instances are left (one as large would have
    # been usable above); with them, one as large may still cover part of `units`.
    smaller = sorted(
        (
            p
            for p in pools
            if p.units > 0
            and (spread is not None or p.units < units)
            and _usable(p, room, share, streak, stable_rounds)
            and (spread is None or spread.get(p.pool_id, 0) > 0)
        ),
        key=lambda p: (p.price_per_hour, p.pool_id),
    )
    # covered units -> the best set found so far that covers them
    best: dict[int, _PartSet] = {0: (0.0, 0, (), ())}
    for p in smaller:
        left = _spread_left(spread, p.pool_id)
        reach = units if left is None else min(units, left)
        limit = min(room.get(p.pool_id, 0), share.get(p.pool_id, max_parts), -(-reach // p.units))
        grown = dict(best)
        for covered, (cost, n, ids, picked) in best.items():
            for k in range(1, min(limit, max_parts - n) + 1):
                got = min(units, covered + min(k * p.units, reach))
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


def _covered(
    targets: Sequence[LifePool], units: int, spread: Mapping[str, int] | None
) -> dict[str, int]:
    """Per pool, the units the instances of `targets` cover of `units`, in order: each
    at most its own units, what is still uncovered and what the spread groups may still
    add in its pool (the planner's count: an instance may be partly used)."""
    out: dict[str, int] = {}
    left = max(units, 1)
    for p in targets:
        got = min(p.units, left)
        room = _spread_left(spread, p.pool_id)
        if room is not None:
            got = min(got, max(0, room - out.get(p.pool_id, 0)))
        out[p.pool_id] = out.get(p.pool_id, 0) + got
        left -= got
    return out


class _SpreadBook:
    """The spread groups of the region's contracts this round: each group's cap and the
    units its members hold per pool, updated as replacements are planned (members of one
    group share the room, whichever contract replaces)."""

    def __init__(self, views: Sequence[ContractLife]) -> None:
        self.rooms: dict[str, SpreadRoom] = {}
        self.used: dict[str, dict[str, int]] = {}
        for v in views:
            for r in v.spread:
                if r.group not in self.rooms:
                    self.rooms[r.group] = r
                    self.used[r.group] = dict(r.used)

    def groups(self, view: ContractLife) -> list[str]:
        return sorted({r.group for r in view.spread})

    def left(self, view: ContractLife, freed: Mapping[str, int]) -> dict[str, int] | None:
        """Per allowed pool, the units the contract's groups may still add there once the
        replaced instances (`freed`: their units per pool) are gone; None: no group."""
        groups = self.groups(view)
        if not groups:
            return None
        return {
            p.pool_id: min(self.rooms[g].cap_units - self.used[g].get(p.pool_id, 0) for g in groups)
            + freed.get(p.pool_id, 0)
            for p in view.pools
        }

    def take(self, view: ContractLife, added: Mapping[str, int], freed: Mapping[str, int]) -> None:
        for g in self.groups(view):
            used = self.used[g]
            for pid, units in freed.items():
                used[pid] = used.get(pid, 0) - units
            for pid, units in added.items():
                used[pid] = used.get(pid, 0) + units

    def why(
        self, view: ContractLife, what: str, added: Mapping[str, int], freed: Mapping[str, int]
    ) -> str:
        """Why `added` (units per pool) breaks the contract's spread groups."""
        for pid, units in added.items():
            for g in self.groups(view):
                room = self.rooms[g]
                now = self.used[g].get(pid, 0) - freed.get(pid, 0)
                if now + units > room.cap_units:
                    return (
                        f"spread: {what} would put {now + units} units of spread group {g} "
                        f"in pool {pid} ({now} there now), spread allows {room.cap_units} "
                        f"in one pool (spread_max_pool_fraction {room.fraction:g} of the "
                        f"group's {room.target_units} units)"
                    )
        groups = ", ".join(self.groups(view))
        return f"spread: spread group(s) {groups} leave no pool room for it"


def _freed(instances: Sequence[LifeInstance]) -> dict[str, int]:
    """Units per pool the replaced instances hold in their spread groups' count (only
    reclaimable ones are counted there, as the planner counts them)."""
    out: dict[str, int] = {}
    for i in instances:
        if not i.committed:
            out[i.pool_id] = out.get(i.pool_id, 0) + i.units
    return out


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
    book = _SpreadBook(views)
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
            freed = _freed([inst])
            left = book.left(view, freed)
            if hold is None:
                fallback = c.reason is DisruptionReason.RETURN_FROM_FALLBACK
                parts = anti_churn.max_return_parts if fallback else 1
                # Where this replacement could start: asked as it is, then with conditions relaxed.
                where = functools.partial(
                    _return_pools, view.pools, room, inst.units, share=share, max_parts=parts
                )
                targets = where(
                    streak=free_streak if fallback else None,
                    stable_rounds=anti_churn.stable_rounds,
                    spread=left,
                )
                if targets is None:
                    near = where(streak=None, stable_rounds=1, spread=left) if fallback else None
                    # Room but for the spread groups: what the replacement would do to them.
                    loose = (
                        where(streak=None, stable_rounds=1)
                        if near is None and left is not None
                        else None
                    )
                    if near is not None:
                        hold = _unstable(near, free_streak, anti_churn.stable_rounds)
                    elif loose is not None:
                        what = "the pieces" if len(loose) > 1 else "the replacement"
                        hold = book.why(view, what, _covered(loose, inst.units, None), freed)
                    else:
                        hold = f"no allowed reclaimable pool has room for {inst.units} unit(s)"
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
            book.take(view, _covered(targets, inst.units, left), freed)
            plan.replace.append(_replacement(name, inst, c, targets))
        if anti_churn.consolidate:
            taken = {c.instance.instance_id for c in candidates}
            taken |= {i.instance_id for i in view.instances if i.hall in undrainable}
            _consolidate(
                plan,
                view,
                room,
                share,
                book,
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
    spread: Mapping[str, int] | None = None,
) -> _Consolidation | None:
    """`spread`: the units the contract's spread groups may still add per pool (None: no
    group); the instances a consolidation replaces give theirs back first."""
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
            spread=spread,
            freed=_freed(group) if spread is not None else None,
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
    book: _SpreadBook,
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
    name = view.contract.name
    reason = DisruptionReason.CONSOLIDATION
    spread = book.left(view, {})
    found = _best_consolidation(view, room, share, free_streak, taken, now, anti_churn, spread)
    if found is None:
        if spread is not None:
            # One the spread groups alone rule out: held, and the ledger says so.
            loose = _best_consolidation(view, room, share, free_streak, taken, now, anti_churn)
            if loose is not None:
                ids = ", ".join(i.instance_id for i in loose.group)
                why = book.why(
                    view,
                    f"one {loose.target.flavor} for {ids}",
                    {loose.target.pool_id: loose.need},
                    _freed(loose.group),
                )
                plan.held.append(
                    Held(
                        contract=name,
                        instance_id=loose.group[0].instance_id,
                        reason=reason,
                        why=why,
                    )
                )
        return
    first = found.group[0].instance_id
    plan.consolidable.append(name)
    ids = ", ".join(i.instance_id for i in found.group)
    why = (
        f"{ids} ({sum(i.units for i in found.group)} units, {found.cost:.3f}/h) -> one "
        f"{found.target.flavor} in {found.target.pool_id} ({found.target.units} units, "
        f"{found.target.price_per_hour:.3f}/h) still covers demand {view.demand_units}"
    )
    if streak + 1 < anti_churn.consolidation_stable_rounds:
        plan.held.append(
            Held(
                contract=name,
                instance_id=first,
                reason=reason,
                why=f"found on {streak + 1} of {anti_churn.consolidation_stable_rounds} rounds "
                "in a row (hysteresis)",
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
    book.take(view, {found.target.pool_id: found.need}, _freed(found.group))
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
