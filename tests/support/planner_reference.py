"""The planner's specification as checks, and its exact reference (HiGHS MILP through
scipy): shared by the planner tests and `bench/planner_bench.py`.

The checks are written from the planner's specification, not from its code; only the cap
rounding (planning.costs) is shared, because it *is* the specification of the caps.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest

from activities.control.exact_plan import scientific
from planning.costs import pool_share_cap, spread_cap
from planning.planner import (
    RESTART_COST_HOURS,
    ContractDemand,
    Plan,
    PlanInput,
    PoolInput,
    risk_cost,
)


def upi(c: ContractDemand, p: PoolInput) -> int:
    fits = [p.vcpu // c.unit_vcpu, p.memory_gib // c.unit_memory_gib]
    if c.unit_gpus:
        fits.append(p.gpus // c.unit_gpus)
    return max(0, min(fits))


def usable(c: ContractDemand, p: PoolInput) -> bool:
    return (
        p.sku in c.skus
        and p.size in c.sizes
        and p.hall in c.halls
        and not p.excluded
        and upi(c, p) >= 1
    )


def check_plan(inp: PlanInput, out: Plan) -> None:
    """Every hard constraint of the planner's contract, from the specification."""
    pools = {p.pool_id: p for p in inp.pools}
    demands = {c.contract: c for c in inp.contracts}
    target = {n: min(c.demand_units, c.max_units_per_region) for n, c in demands.items()}
    held = {
        n: sum(k * upi(c, pools[pid]) for pid, k in c.existing.items()) for n, c in demands.items()
    }

    keys = [(a.contract, a.pool_id) for a in out.allocations]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert [o.contract for o in out.outcomes] == sorted(demands)
    assert out.cost_per_hour == pytest.approx(sum(a.cost_per_hour for a in out.allocations))

    new_in_pool: dict[str, int] = defaultdict(int)
    planned: dict[str, int] = defaultdict(int)
    for a in out.allocations:
        c, p = demands[a.contract], pools[a.pool_id]
        assert usable(c, p), f"{a.contract} may not use {a.pool_id}"
        assert a.hall == p.hall
        assert a.instances > 0
        # Units: whole instances, except that the last may be partly used.
        per = upi(c, p)
        assert (a.instances - 1) * per < a.units <= a.instances * per
        assert a.cost_per_hour == pytest.approx(a.instances * risk_cost(p, c.kind))
        # Pool share cap over existing and new instances.
        cap = pool_share_cap(c.max_pool_share, p.reclaimable_units)
        assert c.existing.get(a.pool_id, 0) + a.instances <= cap
        new_in_pool[a.pool_id] += a.instances
        planned[a.contract] += a.units
    for pool_id, n in new_in_pool.items():
        assert n <= pools[pool_id].free, f"{pool_id}: {n} new instances, {pools[pool_id].free} free"

    # Spread groups: units (existing and new) of all members in any one pool.
    new_units = {(a.contract, a.pool_id): a.units for a in out.allocations}
    for g in {g for c in inp.contracts for g in c.spread_groups}:
        members = [c for c in inp.contracts if g in c.spread_groups]
        cap = spread_cap(inp.spread_max_pool_fraction, sum(target[c.contract] for c in members))
        for pool_id, p in pools.items():
            existing = sum(c.existing.get(pool_id, 0) * upi(c, p) for c in members)
            new = sum(new_units.get((c.contract, pool_id), 0) for c in members)
            if new:
                assert existing + new <= cap, f"group {g} in {pool_id}: {existing}+{new} > {cap}"

    for o in out.outcomes:
        c = demands[o.contract]
        assert o.demand_units == c.demand_units
        assert o.target_units == target[o.contract]
        assert o.held_units == held[o.contract]
        assert o.planned_units == planned[o.contract]
        assert o.planned_units <= max(0, o.target_units - o.held_units)  # never more than needed
        assert o.shortfall_units == max(0, o.target_units - o.held_units - o.planned_units)
        assert o.surplus_units == max(0, o.held_units - o.target_units)


def check_no_easy_shortfall(inp: PlanInput, out: Plan) -> None:
    """A contract left short has no usable pool where one more unit would fit."""
    pools = {p.pool_id: p for p in inp.pools}
    new = {(a.contract, a.pool_id): a for a in out.allocations}
    free = dict.fromkeys(pools, 0)
    for pid, p in pools.items():
        free[pid] = p.free - sum(a.instances for a in out.allocations if a.pool_id == pid)
    target = {c.contract: min(c.demand_units, c.max_units_per_region) for c in inp.contracts}
    group_used: dict[tuple[str, str], int] = defaultdict(int)
    for c in inp.contracts:
        for pid, p in pools.items():
            a = new.get((c.contract, pid))
            units = c.existing.get(pid, 0) * upi(c, p) + (a.units if a else 0)
            for g in c.spread_groups:
                group_used[g, pid] += units
    for o in out.outcomes:
        if not o.shortfall_units:
            continue
        c = next(c for c in inp.contracts if c.contract == o.contract)
        for pid, p in pools.items():
            if not usable(c, p):
                continue
            a = new.get((c.contract, pid))
            instances = a.instances if a else 0
            spare_in_instance = instances * upi(c, p) - (a.units if a else 0)
            share_left = (
                pool_share_cap(c.max_pool_share, p.reclaimable_units)
                - c.existing.get(pid, 0)
                - instances
            )
            more = spare_in_instance > 0 or (share_left > 0 and free[pid] > 0)
            for g in c.spread_groups:
                members = [m for m in inp.contracts if g in m.spread_groups]
                cap = spread_cap(
                    inp.spread_max_pool_fraction, sum(target[m.contract] for m in members)
                )
                more = more and group_used[g, pid] < cap
            assert not more, f"{o.contract} is short but could add a unit in {pid}"


SHAPES = {"gp": (4, 16, 0), "cpu": (4, 8, 0), "mem": (4, 32, 0), "gpu": (8, 96, 1)}


UNITS = [(1, 2, 0), (2, 4, 0), (2, 8, 0), (4, 16, 0), (1, 4, 0), (3, 8, 0), (8, 96, 1), (4, 48, 1)]


KINDS = sorted(RESTART_COST_HOURS)


def milp_reference(inp: PlanInput, time_limit: float = 60.0) -> tuple[int, float]:
    """(least total shortfall, least cost at that shortfall), by HiGHS through scipy.

    Lexicographic in two solves rather than one with a big penalty: a penalty that
    dominates every price would make HiGHS's relative gap tolerance swallow the cost.
    Variables per usable (contract, pool): y new instances (integer), u units they cover
    (integer, u <= upi * y); per contract: s shortfall units.
    """
    np, optimize, sparse = scientific()  # under the planner's import lock (see there)

    pools = {p.pool_id: p for p in inp.pools}
    cs = inp.contracts
    target = [min(c.demand_units, c.max_units_per_region) for c in cs]
    held = [sum(n * upi(c, pools[pid]) for pid, n in c.existing.items()) for c in cs]
    need = [max(0, t - h) for t, h in zip(target, held, strict=True)]
    arcs = []  # (contract index, pool id, upi, cost, max new instances)
    for k, c in enumerate(cs):
        for p in inp.pools:
            if not usable(c, p):
                continue
            cap = pool_share_cap(c.max_pool_share, p.reclaimable_units) - c.existing.get(
                p.pool_id, 0
            )
            if min(cap, p.free) > 0:
                arcs.append((k, p.pool_id, upi(c, p), risk_cost(p, c.kind), min(cap, p.free)))
    n_arcs, n_vars = len(arcs), 2 * len(arcs) + len(cs)
    rows: list[dict[int, float]] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(coefs: dict[int, float], low: float, high: float) -> None:
        rows.append(coefs)
        lo.append(low)
        hi.append(high)

    for k in range(len(cs)):  # covered + shortfall == needed
        coefs = {n_arcs + a: 1.0 for a, arc in enumerate(arcs) if arc[0] == k}
        coefs[2 * n_arcs + k] = 1.0
        row(coefs, need[k], need[k])
    for a, arc in enumerate(arcs):  # u <= upi * y
        row({n_arcs + a: 1.0, a: -float(arc[2])}, -np.inf, 0.0)
    for pid, p in pools.items():  # new instances <= free
        coefs = {a: 1.0 for a, arc in enumerate(arcs) if arc[1] == pid}
        if coefs:
            row(coefs, -np.inf, p.free)
    for g in sorted({g for c in cs for g in c.spread_groups}):
        members = {k for k, c in enumerate(cs) if g in c.spread_groups}
        cap = spread_cap(inp.spread_max_pool_fraction, sum(target[k] for k in members))
        for pid, p in pools.items():
            coefs = {
                n_arcs + a: 1.0 for a, arc in enumerate(arcs) if arc[0] in members and arc[1] == pid
            }
            if coefs:
                used = sum(cs[k].existing.get(pid, 0) * upi(cs[k], p) for k in members)
                row(coefs, -np.inf, max(0, cap - used))
    matrix = sparse.lil_matrix((len(rows), n_vars))
    for i, coefs in enumerate(rows):
        for j, v in coefs.items():
            matrix[i, j] = v
    constraints = [optimize.LinearConstraint(matrix.tocsr(), np.array(lo), np.array(hi))]
    upper = [arc[4] for arc in arcs] + [arc[4] * arc[2] for arc in arcs] + need
    bounds = optimize.Bounds(np.zeros(n_vars), np.array(upper, dtype=float))
    integrality = np.array([1] * (2 * n_arcs) + [0] * len(cs))
    options: dict[str, Any] = {"time_limit": time_limit}

    short = optimize.milp(
        np.array([0.0] * (2 * n_arcs) + [1.0] * len(cs)),
        constraints=constraints,
        integrality=integrality,
        bounds=bounds,
        options=options,
    )
    assert short.status == 0, short.message
    least = round(short.fun)
    at_least = optimize.LinearConstraint(
        np.array([[0.0] * (2 * n_arcs) + [1.0] * len(cs)]), -np.inf, least + 0.5
    )
    cheapest = optimize.milp(
        np.array([arc[3] for arc in arcs] + [0.0] * (n_arcs + len(cs))),
        constraints=[*constraints, at_least],
        integrality=integrality,
        bounds=bounds,
        options={**options, "mip_rel_gap": 1e-7},
    )
    assert cheapest.status == 0, cheapest.message
    return least, float(cheapest.fun)


def contended_instance(seed: int, n_contracts: int = 5) -> PlanInput:
    """5 contracts x 24 pools (3 halls x 4 SKUs x 2 sizes): demand near what the cheap
    pools hold, overlapping placements and spread groups, some existing instances."""
    rng = random.Random(seed)
    pools = []
    for hall in "ABC":
        for sku, (v, m, g) in SHAPES.items():
            for size, mult in (("l", 1), ("xl", 2)):
                base = (0.008 * v + 0.001 * m + 0.5 * g) * mult
                reclaimable = rng.randint(4, 60) // mult + 1
                pools.append(
                    PoolInput(
                        pool_id=f"r1.{hall}.{sku}.{size}",
                        hall=hall,
                        sku=sku,
                        size=size,
                        vcpu=v * mult,
                        memory_gib=m * mult,
                        gpus=g * mult,
                        price_per_hour=round(base * rng.uniform(0.6, 1.4), 4),
                        reclaimable_units=reclaimable,
                        free=rng.randint(0, reclaimable),
                        reclaim_rate=rng.choice([0.0, 0.0, 0.05, 0.2, 0.5]),
                        excluded=rng.random() < 0.05,
                    )
                )
    contracts = []
    for i in range(n_contracts):
        uv, um, ug = rng.choice(UNITS)
        skus = rng.sample(sorted(SHAPES), rng.randint(1, len(SHAPES)))
        if ug and "gpu" not in skus:
            skus.append("gpu")
        demand = rng.randint(0, 120)
        existing = {
            p.pool_id: rng.randint(1, 3) for p in rng.sample(pools, 2) if rng.random() < 0.3
        }
        contracts.append(
            ContractDemand(
                contract=f"c{i}",
                kind=rng.choice(KINDS),
                unit_vcpu=uv,
                unit_memory_gib=um,
                unit_gpus=ug,
                skus=skus,
                sizes=rng.sample(["l", "xl"], rng.randint(1, 2)),
                halls=rng.sample(list("ABC"), rng.randint(1, 3)),
                demand_units=demand,
                max_units_per_region=rng.choice([demand, rng.randint(0, 150)]),
                max_pool_share=rng.choice([0.2, 0.3, 0.5, 1.0]),
                spread_groups=rng.sample(["g1", "g2"], rng.randint(0, 2)),
                existing=existing,
            )
        )
    fraction = rng.choice([0.25, 0.5])
    return PlanInput(contracts=contracts, pools=pools, spread_max_pool_fraction=fraction)


def gap_pct(cost: float, best: float) -> float:
    return 0.0 if best <= 0 else 100.0 * (cost - best) / best
