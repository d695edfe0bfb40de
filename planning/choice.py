"""Why the planner chose these pools for a contract, and not the others: a small record.

The controller asks a :class:`ChoiceExplainer` when it records an acquisition, with the
very problem and plan of that tick, and stores the answer beside the acquisition (decision
0028); `sco explain instance` reads it back. Nothing re-plans: this reads the plan's
allocations against the problem's pools and says, for each pool, which of the planner's
rules kept it out (the tests that make the planner's arcs, planning/planner.py, then the
room the plan itself used up) or that it cost more per unit than the pools chosen.

Pure and deterministic (workflow code calls it): no clock, no randomness, no I/O; ties by
pool id. Bounded: at most ``limit`` pools passed over are kept, the most telling first
(the pools the contract may use, cheapest first, then cheaper pools it may not use); the
rest are counted in ``left_off``.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from planning.costs import pool_share_cap, spread_cap
from planning.models import (
    ContractDemand,
    Plan,
    PlanInput,
    PoolInput,
    risk_cost,
    units_per_instance,
)

#: Pools passed over kept per record: enough for "why not that one", small enough that an
#: acquisition row stays a few kilobytes.
MAX_ALTERNATIVES = 8
#: Digits kept of a cost per unit-hour.
_DIGITS = 6
_TOL = 1e-9


class Verdict(StrEnum):
    CHOSEN = "chosen"
    EXCLUDED = "excluded"  # by the pool exclusion cycle
    NOT_ALLOWED = "not_allowed"  # the contract's skus, sizes or halls
    UNIT_DOES_NOT_FIT = "unit_does_not_fit"
    NO_FREE_CAPACITY = "no_free_capacity"  # none free, or the plan gave it all to others
    POOL_SHARE_CAP = "pool_share_cap"  # the contract's placement.max_pool_share
    SPREAD_CAP = "spread_cap"  # its spread group's spread_max_pool_fraction
    DEARER = "dearer"  # than the dearest pool chosen
    NOT_NEEDED = "not_needed"  # had room, was not dearer: the chosen pools covered the need


class PoolChoice(BaseModel):
    model_config = ConfigDict(frozen=True)

    pool_id: str
    verdict: Verdict
    # Risk-adjusted expected cost of one demand unit for an hour here (planning/costs.py);
    # None where a unit does not fit.
    cost_per_unit_hour: float | None = None
    rank: int | None = None  # by that cost among the pools the contract may use (1: cheapest)
    instances: int = 0  # chosen: new instances the plan put here
    units: int = 0
    dearer_by: float | None = None  # per unit-hour, over the dearest pool chosen
    why: str


class ChoiceRecord(BaseModel):
    """What the acquisition's maker knew about its choice of pools, stored with the
    acquisition. ``basis``: "planner" (the controller's plan; ranked, chosen, passed over),
    "floor" or "lifecycle" (their own reason in ``summary``)."""

    model_config = ConfigDict(frozen=True)

    basis: str
    summary: str = ""
    ranked: int = 0  # pools the contract may use that a unit fits: n of "rank k of n"
    chosen: list[PoolChoice] = []
    passed_over: list[PoolChoice] = []  # the most telling first, at most MAX_ALTERNATIVES
    left_off: int = 0  # pools passed over not kept here
    chosen_elsewhere: int = 0  # pools chosen too, recorded with the plan's other acquisitions


def _allowed(c: ContractDemand, p: PoolInput) -> str:
    """Why the contract's placement does not allow ``p`` ("" when it does)."""
    if p.sku not in c.skus:
        return f"sku {p.sku} not in the contract's skus ({', '.join(c.skus)})"
    if p.size not in c.sizes:
        return f"size {p.size} not in the contract's sizes ({', '.join(c.sizes)})"
    if p.hall not in c.halls:
        return f"hall {p.hall} not in the contract's halls ({', '.join(c.halls)})"
    return ""


def _f(x: float) -> str:
    return f"{x:.4f}"


def _n(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def explain_choice(
    inp: PlanInput, result: Plan, contract: str, *, limit: int = MAX_ALTERNATIVES
) -> ChoiceRecord:
    """Every pool of ``inp`` judged for ``contract`` against the plan ``result`` of ``inp``:
    the pools chosen (cost per unit-hour, rank) and the most telling of those passed over,
    each with the planner's reason. Raises KeyError when ``contract`` is not in ``inp``."""
    return ChoiceExplainer(inp, result).record(contract, limit=limit)


class ChoiceExplainer:
    """:func:`explain_choice` for many contracts of one plan: what they have in common
    (what the plan put where, the spread groups' room) is computed once, here (under a
    millisecond for a whole region), and each contract's record when first asked for
    (about a millisecond for 144 pools), so a controller spreads the cost over the
    workflow activations of the acquisitions it starts."""

    def __init__(self, inp: PlanInput, result: Plan) -> None:
        self._ctx = _Context(inp, result)
        self._records: dict[tuple[str, int], ChoiceRecord] = {}

    def record(self, contract: str, *, limit: int = MAX_ALTERNATIVES) -> ChoiceRecord:
        key = (contract, limit)
        if key not in self._records:
            self._records[key] = self._ctx.record(contract, limit)
        return self._records[key]

    def for_acquisition(self, contract: str, pool_ids: Collection[str]) -> ChoiceRecord:
        """The record as one acquisition of the plan keeps it: only the chosen pools it
        launches in (a plan split over several acquisitions records each pool once), the
        others counted in ``chosen_elsewhere``."""
        record = self.record(contract)
        mine = [c for c in record.chosen if c.pool_id in pool_ids]
        return record.model_copy(
            update={"chosen": mine, "chosen_elsewhere": len(record.chosen) - len(mine)}
        )


class _Context:
    """What the plan put where, computed once for every contract explained."""

    def __init__(self, inp: PlanInput, result: Plan) -> None:
        self.inp = inp
        self.pools = sorted(inp.pools, key=lambda p: p.pool_id)
        self.by_id = {p.pool_id: p for p in self.pools}
        self.ids = [p.pool_id for p in self.pools]
        # (pool id, (sku, size, hall), (vcpu, memory, gpus), pool): the per-contract loop
        # reads plain tuples, not model attributes.
        self.rows = [
            (p.pool_id, (p.sku, p.size, p.hall), (p.vcpu, p.memory_gib, p.gpus), p)
            for p in self.pools
        ]
        self.demands = {c.contract: c for c in inp.contracts}
        # Instances per pool over all contracts; each contract's (instances, units) per
        # pool; who took each pool's free capacity.
        self.placed: dict[str, int] = {}
        self.mine: dict[str, dict[str, tuple[int, int]]] = {}
        self.takers: dict[str, list[str]] = {}
        for a in result.allocations:
            self.placed[a.pool_id] = self.placed.get(a.pool_id, 0) + a.instances
            own = self.mine.setdefault(a.contract, {})
            n, u = own.get(a.pool_id, (0, 0))
            own[a.pool_id] = (n + a.instances, u + a.units)
            if a.contract not in self.takers.setdefault(a.pool_id, []):
                self.takers[a.pool_id].append(a.contract)
        # Per spread group: its cap per pool and the units its members hold in each pool
        # after the plan (existing instances and new units).
        target = {d.contract: min(d.demand_units, d.max_units_per_region) for d in inp.contracts}
        totals: dict[str, int] = {}
        self.used: dict[str, dict[str, int]] = {}
        for d in inp.contracts:
            for g in set(d.spread_groups):
                totals[g] = totals.get(g, 0) + target[d.contract]
                used = self.used.setdefault(g, {})
                for pool_id, n in d.existing.items():
                    if pool_id in self.by_id:
                        upi = units_per_instance(d, self.by_id[pool_id])
                        used[pool_id] = used.get(pool_id, 0) + n * upi
                for pool_id, (_, u) in self.mine.get(d.contract, {}).items():
                    used[pool_id] = used.get(pool_id, 0) + u
        self.cap = {g: spread_cap(inp.spread_max_pool_fraction, t) for g, t in totals.items()}
        self._upi: dict[tuple[int, ...], int] = {}

    def upi(self, c: ContractDemand, p: PoolInput) -> int:
        """units_per_instance, once per (unit shape, instance shape): a region's pools
        repeat a few shapes over its halls."""
        key = (c.unit_vcpu, c.unit_memory_gib, c.unit_gpus, p.vcpu, p.memory_gib, p.gpus)
        n = self._upi.get(key)
        if n is None:
            n = self._upi[key] = units_per_instance(c, p)
        return n

    def record(self, contract: str, limit: int) -> ChoiceRecord:
        c = self.demands[contract]
        mine = self.mine.get(contract, {})
        skus, sizes, halls = set(c.skus), set(c.sizes), set(c.halls)
        judge = _Judge(self, c)
        # Cost per unit-hour of each pool a unit fits; rank among those the contract may
        # use (excluded ones too), cheapest first, ties by pool id.
        cost: dict[str, float] = {}
        usable: list[tuple[float, str]] = []
        allowed: set[str] = set()
        upis: dict[tuple[int, int, int], int] = {}
        kind = c.kind
        for pool_id, where, shape, p in self.rows:
            if where[0] in skus and where[1] in sizes and where[2] in halls:
                allowed.add(pool_id)
            upi = upis.get(shape)
            if upi is None:
                upi = upis[shape] = self.upi(c, p)
            if upi < 1:
                continue
            cost[pool_id] = x = round(risk_cost(p, kind) / upi, _DIGITS)
            if pool_id in allowed:
                usable.append((x, pool_id))
        usable.sort()
        rank = {pool_id: k + 1 for k, (_, pool_id) in enumerate(usable)}
        judge.rank, judge.ranked = rank, len(usable)

        chosen = [judge.chosen(self.by_id[pool_id], *mine[pool_id]) for pool_id in sorted(mine)]
        dearest = max((cost.get(pool_id, 0.0) for pool_id in mine), default=None)
        # The pools passed over, the most telling first: those the contract may use,
        # cheapest first (a unit that does not fit last); then pools it may not use that
        # would have been cheaper than what was chosen. Only the kept ones are judged.
        order: list[tuple[int, float, str]] = []
        for pool_id in self.ids:
            if pool_id in mine:
                continue
            known = cost.get(pool_id)
            if pool_id in allowed:
                order.append((0, float("inf") if known is None else known, pool_id))
            elif known is not None and (dearest is None or known < dearest - _TOL):
                order.append((1, known, pool_id))
        order.sort()
        kept = order[: max(0, limit)]
        passed = [
            judge.passed_over(self.by_id[pool_id], cost.get(pool_id), dearest)
            for _, _, pool_id in kept
        ]
        return ChoiceRecord(
            basis="planner",
            ranked=len(usable),
            chosen=chosen,
            passed_over=passed,
            left_off=len(order) - len(kept),
        )


class _Judge:
    """The reasons about one contract's pools, in words. PoolChoice.model_construct: the
    values are this module's own, and validating a whole region's worth (hundreds per
    tick) would cost the workflow task more than judging them."""

    def __init__(self, ctx: _Context, c: ContractDemand) -> None:
        self.ctx = ctx
        self.c = c
        self.rank: dict[str, int] = {}
        self.ranked = 0

    def chosen(self, p: PoolInput, n: int, u: int) -> PoolChoice:
        c = self.c
        cost = round(risk_cost(p, c.kind) / self.ctx.upi(c, p), _DIGITS)
        limited = self.free_gone(p, mine=True) or self.share_full(p, n) or self.spread_full(p)
        return PoolChoice.model_construct(
            pool_id=p.pool_id,
            verdict=Verdict.CHOSEN,
            cost_per_unit_hour=cost,
            rank=self.rank.get(p.pool_id),
            instances=n,
            units=u,
            why=(
                f"chosen: {_f(cost)}/unit-h risk-adjusted (price {p.price_per_hour:g}/h, "
                f"{p.reclaim_rate:g} reclaims/instance-h), rank "
                f"{self.rank.get(p.pool_id, '?')} of {self.ranked}; {_n(n, 'instance')} for "
                f"{u} units" + (f"; then full: {limited}" if limited else "")
            ),
        )

    def passed_over(self, p: PoolInput, cost: float | None, dearest: float | None) -> PoolChoice:
        c = self.c
        if not_allowed := _allowed(c, p):
            return PoolChoice.model_construct(
                pool_id=p.pool_id,
                verdict=Verdict.NOT_ALLOWED,
                cost_per_unit_hour=cost,
                why=f"not allowed by the contract: {not_allowed}",
            )
        verdict, why, by = self.reason(p, cost, dearest)
        return PoolChoice.model_construct(
            pool_id=p.pool_id,
            verdict=verdict,
            cost_per_unit_hour=cost,
            rank=self.rank.get(p.pool_id),
            dearer_by=by,
            why=why,
        )

    def reason(
        self, p: PoolInput, cost: float | None, dearest: float | None
    ) -> tuple[Verdict, str, float | None]:
        """The planner's first reason to leave out a pool the contract may use: its own
        tests in its order (excluded, a unit fits, free, share cap, spread room), then the
        plan's (free capacity others took), then price."""
        dearer = (
            round(cost - dearest, _DIGITS)
            if cost is not None and dearest is not None and cost > dearest + _TOL
            else None
        )
        also = f" (and dearer by {_f(dearer)}/unit-h)" if dearer is not None else ""
        if p.excluded:
            return Verdict.EXCLUDED, "excluded by the pool exclusion cycle" + also, dearer
        if cost is None:
            return Verdict.UNIT_DOES_NOT_FIT, "a demand unit does not fit one instance", None
        if p.free <= 0:
            return Verdict.NO_FREE_CAPACITY, self.free_gone(p) + also, dearer
        if why := self.share_full(p, 0):
            return Verdict.POOL_SHARE_CAP, f"pool share cap reached: {why}{also}", dearer
        if why := self.spread_full(p):
            return Verdict.SPREAD_CAP, f"spread cap reached: {why}{also}", dearer
        if why := self.free_gone(p):
            return Verdict.NO_FREE_CAPACITY, why + also, dearer
        if dearer is not None:
            return (
                Verdict.DEARER,
                f"dearer: {_f(cost)}/unit-h risk-adjusted (price {p.price_per_hour:g}/h, "
                f"{p.reclaim_rate:g} reclaims/instance-h), {_f(dearer)}/unit-h more than the "
                "dearest pool chosen",
                dearer,
            )
        if dearest is None:
            return Verdict.NOT_NEEDED, "had room, but the plan placed nothing new", None
        if why := self.spread_short(p):
            return Verdict.NOT_NEEDED, f"not needed at {_f(cost)}/unit-h: {why}", None
        return (
            Verdict.NOT_NEEDED,
            f"had room at {_f(cost)}/unit-h, no dearer than the pools chosen: not needed, "
            "they covered the need (ties go by pool id; whole instances)",
            None,
        )

    def spread(self, p: PoolInput) -> list[tuple[str, int, int]]:
        """(group, units its members hold in ``p`` after the plan, its cap per pool) for
        each spread group of the contract, by name."""
        ctx = self.ctx
        return [
            (g, ctx.used.get(g, {}).get(p.pool_id, 0), ctx.cap[g])
            for g in sorted(set(self.c.spread_groups))
        ]

    def spread_full(self, p: PoolInput) -> str:
        """The first spread group of the contract with no room left in ``p``."""
        for g, used, cap in self.spread(p):
            if used >= cap:
                return (
                    f"spread group {g} holds {used} of the {cap} units it may hold in one pool "
                    f"(spread_max_pool_fraction {self.ctx.inp.spread_max_pool_fraction:g})"
                )
        return ""

    def spread_short(self, p: PoolInput) -> str:
        """Why a whole instance of ``p`` would be partly used: its spread groups' room."""
        upi = self.ctx.upi(self.c, p)
        rooms = [(cap - used, g) for g, used, cap in self.spread(p) if cap - used < upi]
        if not rooms:
            return ""
        room, g = min(rooms)
        cost = risk_cost(p, self.c.kind) / max(room, 1)
        return (
            f"an instance holds {upi} units but spread group {g} may add only {room} here: "
            f"{_f(cost)}/unit-h for the units used"
        )

    def share_full(self, p: PoolInput, new: int) -> str:
        c = self.c
        cap = pool_share_cap(c.max_pool_share, p.reclaimable_units)
        held = c.existing.get(p.pool_id, 0) + new
        if held >= cap:
            return (
                f"max_pool_share {c.max_pool_share:g} of {p.reclaimable_units} instances "
                f"allows {cap}; the contract holds {held}" + (" with this plan" if new else "")
            )
        return ""

    def free_gone(self, p: PoolInput, *, mine: bool = False) -> str:
        if p.free <= 0:
            return "no free capacity (0 instances free)"
        if self.ctx.placed.get(p.pool_id, 0) < p.free:
            return ""
        others = [t for t in self.ctx.takers.get(p.pool_id, []) if t != self.c.contract]
        if mine:
            shared = f", shared with {', '.join(others)}" if others else ""
            return f"no free capacity left: the plan used all its {p.free} free instances{shared}"
        whom = f" to {', '.join(others)}" if others else ""
        return f"no free capacity left: the plan gave its {p.free} free instances{whom}"
