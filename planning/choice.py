"""Why the planner chose these pools for a contract, and not the others: a small record.

The controller calls :func:`explain_choice` when it records an acquisition, with the very
problem and plan of that tick, and stores the answer beside the acquisition; `sco explain
instance` reads it back. Nothing re-plans: this reads the plan's allocations against the
problem's pools and says, for each pool, which of the planner's rules kept it out (the
same tests in the same order as the planner's arcs, planning/planner.py) or that it cost
more per unit than the pools chosen.

Pure and deterministic (workflow code calls it): no clock, no randomness, no I/O; ties by
pool id. Bounded: at most ``limit`` pools passed over are kept, the most telling first
(the pools the contract may use, cheapest first, then cheaper pools it may not use); the
rest are counted in ``left_off``.
"""

from __future__ import annotations

from collections.abc import Callable
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
    demands = {c.contract: c for c in inp.contracts}
    c = demands[contract]
    pools = sorted(inp.pools, key=lambda p: p.pool_id)
    target = {d.contract: min(d.demand_units, d.max_units_per_region) for d in inp.contracts}
    by_id = {p.pool_id: p for p in pools}

    # What the plan put where: instances per pool over all contracts, units per
    # (contract, pool), and who took each pool's free capacity.
    placed: dict[str, int] = {}
    takers: dict[str, list[str]] = {}
    units_at: dict[tuple[str, str], int] = {}
    mine: dict[str, tuple[int, int]] = {}
    for a in result.allocations:
        placed[a.pool_id] = placed.get(a.pool_id, 0) + a.instances
        units_at[a.contract, a.pool_id] = units_at.get((a.contract, a.pool_id), 0) + a.units
        if a.contract == contract:
            n, u = mine.get(a.pool_id, (0, 0))
            mine[a.pool_id] = (n + a.instances, u + a.units)
        elif a.contract not in takers.setdefault(a.pool_id, []):
            takers[a.pool_id].append(a.contract)

    def per_unit(p: PoolInput) -> float | None:
        upi = units_per_instance(c, p)
        return round(risk_cost(p, c.kind) / upi, _DIGITS) if upi > 0 else None

    def spread(p: PoolInput) -> list[tuple[str, int, int]]:
        """(group, units its members hold in ``p`` after the plan, its cap per pool) for
        each spread group of ``c``, by name."""
        out = []
        for g in sorted(set(c.spread_groups)):
            members = [d for d in inp.contracts if g in d.spread_groups]
            cap = spread_cap(inp.spread_max_pool_fraction, sum(target[d.contract] for d in members))
            used = sum(
                d.existing.get(p.pool_id, 0) * units_per_instance(d, p)
                + units_at.get((d.contract, p.pool_id), 0)
                for d in members
            )
            out.append((g, used, cap))
        return out

    def spread_full(p: PoolInput) -> str:
        """The first spread group of ``c`` with no room left in ``p`` after the plan."""
        for g, used, cap in spread(p):
            if used >= cap:
                return (
                    f"spread group {g} holds {used} of the {cap} units it may hold in one pool "
                    f"(spread_max_pool_fraction {inp.spread_max_pool_fraction:g})"
                )
        return ""

    def spread_short(p: PoolInput) -> str:
        """Why a whole instance of ``p`` would be partly used: its spread groups' room."""
        upi = units_per_instance(c, p)
        rooms = [(cap - used, g) for g, used, cap in spread(p) if cap - used < upi]
        if not rooms:
            return ""
        room, g = min(rooms)
        cost = risk_cost(p, c.kind) / max(room, 1)
        return (
            f"an instance holds {upi} units but spread group {g} may add only {room} here: "
            f"{_f(cost)} per unit used"
        )

    def share_full(p: PoolInput, new: int) -> str:
        cap = pool_share_cap(c.max_pool_share, p.reclaimable_units)
        held = c.existing.get(p.pool_id, 0) + new
        if held >= cap:
            return (
                f"max_pool_share {c.max_pool_share:g} of {p.reclaimable_units} instances "
                f"allows {cap}; the contract holds {held}" + (" with this plan" if new else "")
            )
        return ""

    def free_gone(p: PoolInput) -> str:
        if p.free <= 0:
            return "no free capacity (0 instances free)"
        if placed.get(p.pool_id, 0) >= p.free:
            others = takers.get(p.pool_id, [])
            whom = f" to {', '.join(others)}" if others else ""
            return f"no free capacity left: the plan gave its {p.free} free instances{whom}"
        return ""

    # Rank the pools the contract may use that a unit fits, excluded ones too.
    usable = [
        (cost, p.pool_id) for p in pools if not _allowed(c, p) and (cost := per_unit(p)) is not None
    ]
    usable.sort()
    rank = {pool_id: k + 1 for k, (_, pool_id) in enumerate(usable)}

    chosen: list[PoolChoice] = []
    for pool_id in sorted(mine):
        p = by_id[pool_id]
        n, u = mine[pool_id]
        cost = per_unit(p)
        limited = free_gone(p) or share_full(p, n) or spread_full(p)
        chosen.append(
            PoolChoice(
                pool_id=pool_id,
                verdict=Verdict.CHOSEN,
                cost_per_unit_hour=cost,
                rank=rank.get(pool_id),
                instances=n,
                units=u,
                why=(
                    f"chosen: {_f(cost or 0.0)}/unit-h risk-adjusted (price "
                    f"{p.price_per_hour:g}/h, {p.reclaim_rate:g} reclaims/instance-h), rank "
                    f"{rank.get(pool_id, '?')} of {len(usable)}; {_n(n, 'instance')} for {u} units"
                    + (f"; then full: {limited}" if limited else "")
                ),
            )
        )
    dearest = max((x.cost_per_unit_hour or 0.0 for x in chosen), default=None)

    # (group, cost, pool id, choice): the pools the contract may use first, cheapest first;
    # then pools it may not use that would have been cheaper than what was chosen.
    passed: list[tuple[int, float, str, PoolChoice]] = []
    for p in pools:
        if p.pool_id in mine:
            continue
        cost = per_unit(p)
        not_allowed = _allowed(c, p)
        if not_allowed:
            if cost is None or (dearest is not None and cost >= dearest - _TOL):
                continue  # neither usable nor cheaper: no question to answer
            passed.append(
                (
                    1,
                    cost,
                    p.pool_id,
                    PoolChoice(
                        pool_id=p.pool_id,
                        verdict=Verdict.NOT_ALLOWED,
                        cost_per_unit_hour=cost,
                        why=f"not allowed by the contract: {not_allowed}",
                    ),
                )
            )
            continue
        verdict, why, by = _passed_over(
            p, cost, dearest, free_gone, share_full, spread_full, spread_short
        )
        passed.append(
            (
                0,
                cost if cost is not None else float("inf"),
                p.pool_id,
                PoolChoice(
                    pool_id=p.pool_id,
                    verdict=verdict,
                    cost_per_unit_hour=cost,
                    rank=rank.get(p.pool_id),
                    dearer_by=by,
                    why=why,
                ),
            )
        )
    passed.sort(key=lambda t: (t[0], t[1], t[2]))
    kept = [t[3] for t in passed[: max(0, limit)]]
    return ChoiceRecord(
        basis="planner",
        ranked=len(usable),
        chosen=chosen,
        passed_over=kept,
        left_off=len(passed) - len(kept),
    )


def _passed_over(
    p: PoolInput,
    cost: float | None,
    dearest: float | None,
    free_gone: Callable[[PoolInput], str],
    share_full: Callable[[PoolInput, int], str],
    spread_full: Callable[[PoolInput], str],
    spread_short: Callable[[PoolInput], str],
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
        return Verdict.NO_FREE_CAPACITY, free_gone(p) + also, dearer
    if why := share_full(p, 0):
        return Verdict.POOL_SHARE_CAP, f"pool share cap reached: {why}{also}", dearer
    if why := spread_full(p):
        return Verdict.SPREAD_CAP, f"spread cap reached: {why}{also}", dearer
    if why := free_gone(p):
        return Verdict.NO_FREE_CAPACITY, why + also, dearer
    if dearer is not None:
        return (
            Verdict.DEARER,
            f"dearer: {_f(cost)}/unit-h risk-adjusted (price {p.price_per_hour:g}/h, "
            f"{p.reclaim_rate:g} reclaims/instance-h), "
            f"{_f(dearer)}/unit-h more than the dearest pool chosen",
            dearer,
        )
    if dearest is None:
        return Verdict.NOT_NEEDED, "had room, but the plan placed nothing new", None
    if why := spread_short(p):
        return Verdict.NOT_NEEDED, f"not needed at {_f(cost)}/unit-h: {why}", None
    return (
        Verdict.NOT_NEEDED,
        f"had room at {_f(cost)}/unit-h, no dearer than the pools chosen: not needed, they "
        "covered the need (ties go by pool id; whole instances)",
        None,
    )
