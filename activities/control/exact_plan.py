"""The planner's tail closed: the exact plan (a MILP solved by HiGHS) under a time budget,
with the greedy plan as the bound to beat and the answer when HiGHS cannot beat it in time.

The greedy planner (planning/planner.py) runs in workflow code and is within a fraction of
a percent on most instances, but several percent off on small contended ones. The exact
problem for a whole region solves in about a second and a half: too slow and too
nondeterministic for workflow code, fine for an activity, whose result the history
records. Lexicographic in two solves, as the test suite's reference: least shortfall
first, then least cost at that shortfall (one solve with a big shortfall penalty would let
HiGHS's relative gap swallow the cost). When the least shortfall is the greedy plan's,
the second solve is cut off at the greedy cost, so HiGHS searches only for better plans.

The result is never worse than the greedy plan: same shortfall or less, and at equal
shortfall the same cost or less.
"""

from __future__ import annotations

import importlib
import math
import threading
import time
from typing import Any

from pydantic import BaseModel, Field

from planning.costs import pool_share_cap, spread_cap
from planning.models import (
    Allocation,
    ContractOutcome,
    Plan,
    PlanInput,
    risk_cost,
    units_per_instance,
)


class ExactPlanInput(BaseModel):
    problem: PlanInput
    greedy: Plan
    time_budget_seconds: float = Field(default=5.0, gt=0)


class ExactPlanResult(BaseModel):
    plan: Plan
    # "exact"; "greedy": HiGHS found nothing better; "greedy-timeout"; "greedy-no-solver";
    # "greedy-busy": the solver threads were busy until the activity's time was spent.
    source: str
    seconds: float = 0.0
    greedy_cost_per_hour: float = 0.0


def _shortfall(p: Plan) -> int:
    return sum(o.shortfall_units for o in p.outcomes)


def exact_plan_before(inp: ExactPlanInput, deadline: float) -> ExactPlanResult:
    """`exact_plan` with what is left of its budget before `deadline` (`time.monotonic()`):
    a solve that waited for a solver thread gets the rest of its activity's time, never
    more than its budget; with none left it is the greedy plan ("greedy-busy")."""
    left = min(inp.time_budget_seconds, deadline - time.monotonic())
    if left <= 0:
        greedy = inp.greedy
        return ExactPlanResult(
            plan=greedy, source="greedy-busy", greedy_cost_per_hour=greedy.cost_per_hour
        )
    return exact_plan(inp.model_copy(update={"time_budget_seconds": left}))


def exact_plan(inp: ExactPlanInput) -> ExactPlanResult:
    """The better of the exact plan found within the budget and the greedy plan."""
    start = time.monotonic()
    greedy = inp.greedy
    source = "greedy"
    try:
        found = _solve(inp.problem, greedy, inp.time_budget_seconds, start)
    except ImportError:
        found, source = None, "greedy-no-solver"  # no scipy on this worker
    elapsed = time.monotonic() - start
    took = round(elapsed, 3)
    if found is None:
        if elapsed >= inp.time_budget_seconds:
            source = "greedy-timeout"
        return ExactPlanResult(
            plan=greedy, source=source, seconds=took, greedy_cost_per_hour=greedy.cost_per_hour
        )
    better = (_shortfall(found), found.cost_per_hour) < (
        _shortfall(greedy),
        greedy.cost_per_hour - 1e-9,
    )
    return ExactPlanResult(
        plan=found if better else greedy,
        source="exact" if better else "greedy",
        seconds=took,
        greedy_cost_per_hour=greedy.cost_per_hour,
    )


#: One import of numpy/scipy at a time: the worker runs this activity on several threads,
#: and two threads importing numpy's lazy submodules at once can see a half-initialised
#: module (CI: RecursionError in numpy.__getattr__ on `dtypes` inside scipy's import).
_IMPORT_LOCK = threading.Lock()


def scientific() -> tuple[Any, Any, Any]:
    """numpy, scipy.optimize and scipy.sparse, imported once, on first use (the CLI and
    the workers that never plan exactly do not pay for them). Everything in a process
    that imports them goes through here (the tests' MILP reference too): an import outside
    the lock races the activity threads' and can leave numpy half-initialised (CI: a
    RecursionError in numpy.__getattr__ for `linalg`, then a corrupted interpreter)."""
    with _IMPORT_LOCK:
        return (
            importlib.import_module("numpy"),
            importlib.import_module("scipy.optimize"),
            importlib.import_module("scipy.sparse"),
        )


def warm_up() -> bool:
    """Import the scientific stack now (a worker at start, on a thread): the first demand
    change's tick then plans without waiting ~0.5 s of CPU for scipy's import, and that
    tick is on the operator's path (`sco demand set` until the acquisition is listed).
    False: no scipy on this worker (the greedy plan stands, as in exact_plan)."""
    try:
        scientific()
    except ImportError:
        return False
    return True


def _solve(inp: PlanInput, greedy: Plan, budget: float, start: float) -> Plan | None:
    # scipy ships no type stubs: the modules are Any here, the results checked by value.
    np, optimize, sparse = scientific()

    pools = sorted(inp.pools, key=lambda p: p.pool_id)
    index = {p.pool_id: i for i, p in enumerate(pools)}
    cs = sorted(inp.contracts, key=lambda c: c.contract)
    upi = [[units_per_instance(c, p) for p in pools] for c in cs]
    target = [min(c.demand_units, c.max_units_per_region) for c in cs]
    held = [sum(n * upi[k][index[pid]] for pid, n in c.existing.items()) for k, c in enumerate(cs)]
    need = [max(0, t - h) for t, h in zip(target, held, strict=True)]
    # Arcs: (contract, pool index, units per instance, cost per instance, max new instances).
    arcs: list[tuple[int, int, int, float, int]] = []
    for k, c in enumerate(cs):
        skus, sizes, halls = set(c.skus), set(c.sizes), set(c.halls)
        for i, p in enumerate(pools):
            if p.excluded or upi[k][i] < 1 or p.sku not in skus or p.size not in sizes:
                continue
            if p.hall not in halls:
                continue
            cap = pool_share_cap(c.max_pool_share, p.reclaimable_units) - c.existing.get(
                p.pool_id, 0
            )
            if min(cap, p.free) > 0:
                arcs.append((k, i, upi[k][i], risk_cost(p, c.kind), min(cap, p.free)))
    n_arcs, n_vars = len(arcs), 2 * len(arcs) + len(cs)
    rows: list[tuple[dict[int, float], float, float]] = []
    by_contract: dict[int, list[int]] = {}
    by_pool: dict[int, list[int]] = {}
    for a, (k, i, *_rest) in enumerate(arcs):
        by_contract.setdefault(k, []).append(a)
        by_pool.setdefault(i, []).append(a)
    for k in range(len(cs)):  # covered + shortfall == needed
        coefs = {n_arcs + a: 1.0 for a in by_contract.get(k, [])}
        coefs[2 * n_arcs + k] = 1.0
        rows.append((coefs, need[k], need[k]))
    for a, arc in enumerate(arcs):  # units <= units per instance * instances
        rows.append(({n_arcs + a: 1.0, a: -float(arc[2])}, -math.inf, 0.0))
    for i, members in by_pool.items():  # new instances <= free
        rows.append(({a: 1.0 for a in members}, -math.inf, float(pools[i].free)))
    for g in sorted({g for c in cs for g in c.spread_groups}):
        group = {k for k, c in enumerate(cs) if g in c.spread_groups}
        cap = spread_cap(inp.spread_max_pool_fraction, sum(target[k] for k in group))
        for i, members in by_pool.items():
            coefs = {n_arcs + a: 1.0 for a in members if arcs[a][0] in group}
            if coefs:
                pid = pools[i].pool_id
                used = sum(cs[k].existing.get(pid, 0) * upi[k][i] for k in group)
                rows.append((coefs, -math.inf, float(max(0, cap - used))))
    matrix = sparse.lil_matrix((len(rows), n_vars))
    for r, (coefs, _, _) in enumerate(rows):
        for j, v in coefs.items():
            matrix[r, j] = v
    constraints: list[Any] = [
        optimize.LinearConstraint(
            matrix.tocsr(), np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
        )
    ]
    upper = [a[4] for a in arcs] + [a[4] * a[2] for a in arcs] + need
    bounds = optimize.Bounds(np.zeros(n_vars), np.array(upper, dtype=float))
    integrality = np.array([1] * (2 * n_arcs) + [0] * len(cs))

    def left() -> float:
        return budget - (time.monotonic() - start)

    if left() <= 0:
        return None
    short_obj = np.array([0.0] * (2 * n_arcs) + [1.0] * len(cs))
    short = optimize.milp(
        short_obj,
        constraints=constraints,
        integrality=integrality,
        bounds=bounds,
        options={"time_limit": left()},
    )
    if short.status != 0 or left() <= 0:
        return None
    least = round(short.fun)
    constraints.append(optimize.LinearConstraint(short_obj[None, :], -math.inf, least + 0.5))
    cost_obj = np.array([a[3] for a in arcs] + [0.0] * (n_arcs + len(cs)))
    if least == _shortfall(greedy):
        # Only plans cheaper than the greedy one are of interest: a cut-off prunes the search.
        constraints.append(
            optimize.LinearConstraint(cost_obj[None, :], -math.inf, greedy.cost_per_hour + 1e-6)
        )
    cheapest = optimize.milp(
        cost_obj,
        constraints=constraints,
        integrality=integrality,
        bounds=bounds,
        options={"time_limit": left(), "mip_rel_gap": 1e-6},
    )
    if cheapest.x is None:
        return None  # infeasible under the cut-off (greedy is optimal) or out of time
    if left() <= 0:
        return None  # an answer past the budget is later than the tick allows
    x = cheapest.x
    allocations: list[Allocation] = []
    planned = [0] * len(cs)
    total = 0.0
    for a, (k, i, per, cost, _) in enumerate(arcs):
        units = round(x[n_arcs + a])
        if units <= 0:
            continue
        instances = -(-units // per)  # no instance more than the units need
        planned[k] += units
        total += instances * cost
        allocations.append(
            Allocation(
                contract=cs[k].contract,
                pool_id=pools[i].pool_id,
                hall=pools[i].hall,
                instances=instances,
                units=units,
                cost_per_hour=instances * cost,
            )
        )
    allocations.sort(key=lambda al: (al.contract, al.pool_id))
    outcomes = [
        ContractOutcome(
            contract=c.contract,
            demand_units=c.demand_units,
            target_units=target[k],
            held_units=held[k],
            planned_units=planned[k],
            shortfall_units=max(0, target[k] - held[k] - planned[k]),
            surplus_units=max(0, held[k] - target[k]),
        )
        for k, c in enumerate(cs)
    ]
    return Plan(allocations=allocations, outcomes=outcomes, cost_per_hour=total)
