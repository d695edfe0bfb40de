"""The portfolio planner: which pools new reclaimable instances go to, for which contract.

Cost model. Reclaimable capacity is cheap but can be taken back; every reclaim throws
away the work in flight, which must be redone on another instance. A pool whose
instances are reclaimed ``reclaim_rate`` times per instance-hour, used by a workload that
loses ``RESTART_COST_HOURS[kind]`` hours of instance time per reclaim, therefore costs

    price_per_hour * (1 + reclaim_rate * RESTART_COST_HOURS[kind])

per *useful* instance-hour (:func:`risk_cost`). Training, which falls back to its last
checkpoint, pays far more for a flaky pool than a stateless service replica does, so the
two are steered to different pools even at the same price.

Problem. Each contract wants ``target = min(demand_units, max_units_per_region)`` units,
some already covered by instances it holds; the planner covers the rest with new
instances, at minimum total risk-adjusted cost, subject to: a contract only uses pools
its placement allows, that are not excluded, and that hold at least one unit; new
instances in a pool fit its free capacity; a contract holds at most
``floor(max_pool_share * reclaimable_units)`` instances of a pool; the members of a
spread group hold together at most ``ceil(spread_max_pool_fraction * their targets)``
units in any one pool. Units left uncovered (shortfall) are penalised above any price, so
there is shortfall only where these constraints leave no room.

Algorithm. The exact solution is a mixed-integer program: too slow and too heavy for
workflow code. The planner is a greedy with regret ordering followed by a bounded local
search (:func:`plan`); tests/workflows/test_planner.py and bench/planner_bench.py measure it against
the exact optimum (HiGHS). It is pure, deterministic Python without clocks, randomness or
I/O: the controller runs it in a local activity (decision 0015), and controllers that
began before that still run it in workflow code, where a replay must reproduce it
exactly: a change to it must not change its plans (bench/planner_bench.py, the tests).
Ties are broken by contract name and pool id, so the order of the inputs does not matter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from planning.costs import RESTART_COST_HOURS, pool_share_cap, spread_cap
from planning.models import (
    Allocation,
    ContractDemand,
    ContractOutcome,
    Plan,
    PlanInput,
    PoolInput,
    contract_demand,
    pool_input,
    risk_cost,
    units_per_instance,
)

__all__ = [
    "RESTART_COST_HOURS",
    "Allocation",
    "ContractDemand",
    "ContractOutcome",
    "Plan",
    "PlanInput",
    "PoolInput",
    "contract_demand",
    "plan",
    "pool_input",
    "risk_cost",
    "units_per_instance",
]


# --- the solver ---------------------------------------------------------------------------

# Shortfall is compared before cost (lexicographically), never mixed into a float sum:
# a penalty large enough to dominate every price would swallow the cost differences in
# rounding. _BIG only orders regrets and exchange estimates.
_BIG = 1e12
_TOL = 1e-9
# Bounds on the local search, so a pathological input cannot make a workflow task slow.
_MAX_PASSES = 20
_MAX_MOVES = 2000
_MAX_TRIES = 5000
_MAX_CHAINS = 8  # chains tried per contract and sweep, best estimate first
_MAX_CHAIN_TRIES = 50  # per start: chains are the dearest moves to try
# Problems whose local search was short (small or easy ones) also get a second start from
# plain cheapest-first greedy: the search ends in different optima from the two, and the
# better is kept. Counting tried moves keeps this deterministic, unlike a clock.
_SECOND_START_TRIES = 250


class _Solver:
    """Mutable search state on index-based lists (the models are far too slow to touch in
    the inner loops). Contracts are indexed in name order, pools in pool-id order, and each
    contract's arcs (usable pools) in increasing cost per unit, so every scan is
    deterministic."""

    def __init__(self, inp: PlanInput) -> None:
        pools = sorted(inp.pools, key=lambda p: p.pool_id)
        contracts = sorted(inp.contracts, key=lambda c: c.contract)
        _check_unique([p.pool_id for p in pools], "pool_id")
        _check_unique([c.contract for c in contracts], "contract")
        self.pools = pools
        self.contracts = contracts
        index = {p.pool_id: i for i, p in enumerate(pools)}

        self.free = [p.free for p in pools]
        self.target = [min(c.demand_units, c.max_units_per_region) for c in contracts]
        self.held = [0] * len(contracts)
        for k, c in enumerate(contracts):
            for pool_id, n in c.existing.items():
                if pool_id not in index:
                    raise ValueError(
                        f"contract {c.contract}: holds instances in unknown pool {pool_id!r}; "
                        "pass every pool of the region (excluded=True for excluded ones)"
                    )
                self.held[k] += n * units_per_instance(c, pools[index[pool_id]])
        self.need = [max(0, t - h) for t, h in zip(self.target, self.held, strict=True)]

        # Spread groups: the per-pool room left in units after existing instances.
        group_names = sorted({g for c in contracts for g in c.spread_groups})
        gidx = {g: i for i, g in enumerate(group_names)}
        self.groups = [sorted({gidx[g] for g in c.spread_groups}) for c in contracts]
        self.room: list[list[int]] = []
        for g in group_names:
            members = [k for k, c in enumerate(contracts) if g in c.spread_groups]
            cap = spread_cap(inp.spread_max_pool_fraction, sum(self.target[k] for k in members))
            used = [0] * len(pools)
            for k in members:
                for pool_id, n in contracts[k].existing.items():
                    i = index[pool_id]
                    used[i] += n * units_per_instance(contracts[k], pools[i])
            self.room.append([max(0, cap - x) for x in used])

        # Arcs: (contract, usable pool), cheapest per unit first, ties by pool id.
        self.ap: list[list[int]] = []  # pool index
        self.aupi: list[list[int]] = []  # units per instance
        self.ac: list[list[float]] = []  # risk-adjusted cost per instance
        self.acu: list[list[float]] = []  # ... per unit
        self.acap: list[list[int]] = []  # new instances the pool share cap allows
        self.arc_of: list[dict[int, int]] = []  # pool index -> arc index
        for c in contracts:
            skus, sizes, halls = set(c.skus), set(c.sizes), set(c.halls)
            arcs = []
            for i, p in enumerate(pools):
                # The cheap tests first: most pools are not the contract's shapes.
                if p.excluded or p.sku not in skus or p.size not in sizes or p.hall not in halls:
                    continue
                upi = units_per_instance(c, p)
                if upi < 1:
                    continue
                cap = pool_share_cap(c.max_pool_share, p.reclaimable_units)
                cap -= c.existing.get(p.pool_id, 0)
                if cap <= 0 or p.free <= 0:
                    continue
                cost = risk_cost(p, c.kind)
                arcs.append((cost / upi, i, upi, cost, cap))
            arcs.sort()
            self.acu.append([a[0] for a in arcs])
            self.ap.append([a[1] for a in arcs])
            self.aupi.append([a[2] for a in arcs])
            self.ac.append([a[3] for a in arcs])
            self.acap.append([a[4] for a in arcs])
            self.arc_of.append({a[1]: j for j, a in enumerate(arcs)})
        # Per pool: (contract, its arc there) for every contract that may use it, in
        # contract order.
        self.pool_arcs: list[list[tuple[int, int]]] = [[] for _ in pools]
        for k, row in enumerate(self.ap):
            for j, i in enumerate(row):
                self.pool_arcs[i].append((k, j))

        n = len(contracts)
        self.y: list[list[int]] = [[0] * len(self.ap[k]) for k in range(n)]
        self.u: list[list[int]] = [[0] * len(self.ap[k]) for k in range(n)]
        self.left = list(self.need)  # units still uncovered, per contract
        self.slack = [0] * n  # arcs with a partly used instance, per contract
        self.cost = 0.0
        self.log: list[tuple[int, int, int]] | None = None  # undo log while trying a move
        self.tries = 0  # moves tried
        self.chain_tries = 0

    # -- primitive operations ---------------------------------------------------------

    def headroom(self, k: int, j: int) -> int:
        """Units contract k could still add on arc j, whatever it needs."""
        p = self.ap[k][j]
        upi = self.aupi[k][j]
        y = self.y[k][j]
        inst = self.acap[k][j] - y
        free = self.free[p]
        units = y * upi - self.u[k][j] + (inst if inst < free else free) * upi
        for g in self.groups[k]:
            room = self.room[g][p]
            if room < units:
                units = room
        return units if units > 0 else 0

    def _first_with_room(self, k: int, start: int, skip: int = -1) -> int:
        """The first arc of contract k from ``start`` on (``skip`` aside) with headroom;
        the number of arcs when none has. :meth:`headroom` inlined: this scan is the
        planner's innermost loop."""
        ap, aupi, acap, yk, uk = self.ap[k], self.aupi[k], self.acap[k], self.y[k], self.u[k]
        free, rooms, groups = self.free, self.room, self.groups[k]
        n = len(ap)
        while start < n:
            if start != skip:
                p, y, upi = ap[start], yk[start], aupi[start]
                inst, f = acap[start] - y, free[p]
                if y * upi - uk[start] + (inst if inst < f else f) * upi > 0:
                    for g in groups:
                        if rooms[g][p] <= 0:
                            break
                    else:
                        return start
            start += 1
        return n

    def add(self, k: int, j: int, x: int) -> None:
        """Move x units of contract k onto arc j (x < 0 takes them off)."""
        uk, yk = self.u[k], self.y[k]
        upi, u0, y0 = self.aupi[k][j], uk[j], yk[j]
        u = u0 + x
        y = -(-u // upi)
        dy = y - y0
        p = self.ap[k][j]
        self.slack[k] += (u < y * upi) - (u0 < y0 * upi)
        uk[j] = u
        yk[j] = y
        if dy:  # adding 0.0 to the cost would change nothing either
            self.free[p] -= dy
            self.cost += dy * self.ac[k][j]
        for g in self.groups[k]:
            self.room[g][p] -= x
        self.left[k] -= x
        if self.log is not None:
            self.log.append((k, j, x))

    def eff_cost(self, k: int, j: int, x: int) -> float:
        """Cost per unit of adding x units of contract k on arc j (a partly used last
        instance makes it dearer than the arc's cost per unit)."""
        upi = self.aupi[k][j]
        u = self.u[k][j]
        dy = -(-(u + x) // upi) - -(-u // upi)
        return dy * self.ac[k][j] / x

    def best_arc(self, k: int, skip: int = -1, start: int = 0) -> tuple[int, float, int]:
        """Contract k's cheapest next step: (arc, cost per unit, units); arc -1 when no arc
        has room.

        On each arc three amounts compete: whole instances only (the arc's cost per unit),
        everything still needed (finishing with a partly used instance can beat moving on
        to a dearer arc), and all the room there is (a spread cap can leave room for less
        than an instance). Arcs come in cost-per-unit order and a step never costs less
        per unit than its arc, so the scan stops at the first arc that cannot win."""
        need = self.left[k]
        best, best_cost, best_x = -1, _BIG, 0
        ap, acu, aupi, ac, acap = self.ap[k], self.acu[k], self.aupi[k], self.ac[k], self.acap[k]
        yk, uk, free, rooms, groups = self.y[k], self.u[k], self.free, self.room, self.groups[k]
        for j in range(start, len(acu)):
            if acu[j] >= best_cost - _TOL:
                break
            if j == skip:
                continue
            # min(headroom(k, j), need), inlined
            p, upi, y, u = ap[j], aupi[j], yk[j], uk[j]
            inst, f = acap[j] - y, free[p]
            room = y * upi - u + (inst if inst < f else f) * upi
            for g in groups:
                if rooms[g][p] < room:
                    room = rooms[g][p]
            if need < room:
                room = need
            if room <= 0:
                continue
            whole = (u + room) // upi * upi - u
            for x in (whole, room) if 0 < whole < room else (room,):
                # eff_cost(k, j, x), inlined
                c = (-(-(u + x) // upi) - -(-u // upi)) * ac[j] / x
                if c < best_cost - _TOL:
                    best, best_cost, best_x = j, c, x
        return best, best_cost, best_x

    def fill(self, k: int, skip_pool: int = -1) -> None:
        """Cover what contract k still needs, cheapest arcs first.

        Only k's own additions change room meanwhile, and only on the arc they go to, so an
        arc without room stays without room: the scans start past the dead cheap ones."""
        skip = self.arc_of[k].get(skip_pool, -1)
        start = 0
        while self.left[k] > 0:
            start = self._first_with_room(k, start, skip)
            j, _, x = self.best_arc(k, skip, start)
            if j < 0:
                return
            self.add(k, j, x)

    def objective(self) -> tuple[int, float]:
        return sum(self.left), self.cost

    # -- phase 1: greedy with regret ordering ---------------------------------------------

    def greedy(self, regret_order: bool = True) -> None:
        """Vogel-like: serve the contract that would lose most by waiting (the gap between
        its best and second-best cost per unit; a contract with a single option stands to
        lose the shortfall penalty), as much as its best arc takes; repeat.

        During this phase room only shrinks, so an arc without room stays without room:
        each contract keeps a start index past its dead cheapest arcs, and its (best,
        second) choice is cached until an allocation touches one of their pools."""
        n = len(self.contracts)
        start = [0] * n
        cache: list[tuple[float, int, int, int, int] | None] = [None] * n
        active = [k for k in range(n) if self.left[k] > 0]
        while active:
            pick: tuple[float, int, int, int, int] | None = None
            still = []
            for k in active:
                entry = cache[k]
                if entry is None:
                    start[k] = self._first_with_room(k, start[k])
                    j1, c1, x1 = self.best_arc(k, start=start[k])
                    if j1 < 0:
                        continue  # nothing left for k: the rest is shortfall
                    j2, c2, _ = self.best_arc(k, skip=j1, start=start[k])
                    regret = (c2 if j2 >= 0 else _BIG) - c1
                    if not regret_order:
                        regret = -c1  # plain cheapest-first
                    entry = (-regret, k, j1, x1, self.ap[k][j2] if j2 >= 0 else -1)
                    cache[k] = entry
                still.append(k)
                if pick is None or entry < pick:
                    pick = entry
            active = still
            if pick is None:
                return
            _, k, j, x, _ = pick
            self.add(k, j, x)
            pool = self.ap[k][j]
            cache[k] = None
            for other in active:
                e = cache[other]
                if e is not None and (self.ap[other][e[2]] == pool or e[4] == pool):
                    cache[other] = None
            active = [a for a in active if self.left[a] > 0]

    # -- phase 2: local search -----------------------------------------------------------

    def improve(self) -> None:
        """Local search: exchanges (:meth:`_exchange_for`) for every contract until none
        helps, then chains (:meth:`_chain_for`), then drops (:meth:`_drop_for`), and again
        while anything helped (within the bounds). A move is kept only if it lowers
        (shortfall, cost), so the search always terminates."""
        moves = 0
        for _ in range(_MAX_PASSES):
            self._fill_all()
            improved = False
            # Chains cost the most to search: only once nothing simpler helps.
            for steps in ((self._exchange_for, self._drop_for), (self._chain_for,)):
                for step in steps:
                    for k in range(len(self.contracts)):
                        while moves < _MAX_MOVES and self.tries < _MAX_TRIES and step(k):
                            improved = True
                            moves += 1
                if improved:
                    break
            if not improved:
                return
        self._fill_all()

    def _fill_all(self) -> None:
        # Room freed by moves may serve a short contract; more cover always wins.
        for k in range(len(self.contracts)):
            self.fill(k)

    def _margin(self, k: int) -> float:
        """Cost per unit of contract k's dearest unit (or the shortfall penalty)."""
        if self.left[k] > 0:
            return _BIG
        worst = 0.0
        for j, u in enumerate(self.u[k]):
            if u:
                worst = max(worst, self.acu[k][j])
        return worst

    def _fallbacks(self, k: int) -> tuple[int, float, float]:
        """Where contract k's next units would go: (pool, its cost per unit, the cost per
        unit without that pool). The unused part of a partly used instance costs 0."""
        first_pool, first, second = -1, _BIG, _BIG
        any_slack = self.slack[k] > 0
        ap, acu, aupi, acap, yk, uk = (
            self.ap[k],
            self.acu[k],
            self.aupi[k],
            self.acap[k],
            self.y[k],
            self.u[k],
        )
        free, rooms, groups = self.free, self.room, self.groups[k]
        for j in range(len(acu)):
            y, upi, u = yk[j], aupi[j], uk[j]
            cost = 0.0 if any_slack and u < y * upi else acu[j]
            if cost >= second:
                if any_slack:
                    continue
                break  # arcs are in cost order: none further can be cheaper
            # headroom(k, j) == 0, inlined
            p = ap[j]
            inst, f = acap[j] - y, free[p]
            if y * upi - u + (inst if inst < f else f) * upi <= 0:
                continue
            if any(rooms[g][p] <= 0 for g in groups):
                continue
            if cost < first:
                first_pool, first, second = p, cost, first
            else:
                second = cost
        return first_pool, first, second

    def _drop_for(self, k: int) -> bool:
        """Give up the last instance on an arc of contract k, or the whole arc, if its units
        cost more than k's next room would, and cover them elsewhere. This mends tails:
        a partly used instance, or units that fit the unused part of one elsewhere."""
        _, fallback, _ = self._fallbacks(k)
        for j, u in enumerate(self.u[k]):
            if not u:
                continue
            y, upi, c = self.y[k][j], self.aupi[k][j], self.ac[k][j]
            top = u - (y - 1) * upi
            if c > top * fallback + _TOL and self._try(partial(self._drop, k, j, top)):
                return True
            partly = u < y * upi
            if (
                y > 1
                and (partly or fallback == 0.0)
                and y * c > u * fallback + _TOL
                and self._try(partial(self._drop, k, j, u))
            ):
                return True
        return False

    def _exchange_for(self, b: int) -> bool:
        """Contract b would rather use pool p than its dearest units (or its shortfall),
        but p is full or b's spread group has no room left in it. If b values an instance
        of p more than an occupant a does (a's value: what it would pay to replace its
        units there on its next-best room), take one instance of a out of p, as many as
        b's dearest units need, or all; shift b's dearest units into p; cover a's loss
        where it can."""
        fallbacks: dict[int, tuple[int, float, float]] = {}  # moves that fail leave no trace

        def next_cost(k: int, pool: int) -> float:
            if k not in fallbacks:
                fallbacks[k] = self._fallbacks(k)
            first_pool, first, second = fallbacks[k]
            return second if pool == first_pool else first

        margin = self._margin(b)
        acu, ap, aupi, ac = self.acu[b], self.ap[b], self.aupi[b], self.ac[b]
        u, y, ac_all = self.u, self.y, self.ac
        for j in range(len(acu)):
            if acu[j] >= margin - _TOL:
                return False
            if self.headroom(b, j) > 0 and self._try(partial(self._shift, b, j)):
                return True
            if y[b][j] >= self.acap[b][j]:
                continue  # b's own share cap: no exchange can help
            p = ap[j]
            value_b = aupi[j] * margin - ac[j]
            for a, ja in self.pool_arcs[p]:
                ua = u[a][ja]
                if a == b or ua == 0:
                    continue
                top = ua - (y[a][ja] - 1) * self.aupi[a][ja]
                loss_a = top * next_cost(a, p) - ac_all[a][ja]
                if value_b > loss_a + _TOL:
                    # One instance, enough for b's dearest arc (or shortfall), or all.
                    wanted = -(-self._dearest_units(b) // self.aupi[b][j])
                    for n in sorted({1, min(wanted, self.y[a][ja]), self.y[a][ja]}):
                        if self._try(partial(self._exchange, a, ja, b, j, n)):
                            return True
        return False

    def _top(self, k: int, j: int) -> int:
        """Units in contract k's last instance on arc j: what giving one instance up costs
        it (less than a whole instance's worth when that one is partly used)."""
        return self.u[k][j] - (self.y[k][j] - 1) * self.aupi[k][j]

    def _dearest_units(self, k: int) -> int:
        """Units of contract k that cost it most: its shortfall, or its dearest arc's."""
        if self.left[k] > 0:
            return self.left[k]
        dearest, worst = 0, -1.0
        for j, u in enumerate(self.u[k]):
            if u and self.acu[k][j] > worst:
                dearest, worst = u, self.acu[k][j]
        return dearest

    def _occupants(self) -> list[list[tuple[int, int]]]:
        """Per pool: (contract, its arc) of every contract holding new units there."""
        out: list[list[tuple[int, int]]] = [[] for _ in self.pools]
        for k, units in enumerate(self.u):
            for j, u in enumerate(units):
                if u:
                    out[self.ap[k][j]].append((k, j))
        return out

    def _blocked(
        self, k: int, occupants: list[list[tuple[int, int]]]
    ) -> list[tuple[int, int, int]]:
        """(arc of k, occupant, occupant's arc) for every pool where contract k could hold
        more but for the room other contracts take: free capacity or a spread cap."""
        out: list[tuple[int, int, int]] = []
        ap, aupi, acap, yk, uk = self.ap[k], self.aupi[k], self.acap[k], self.y[k], self.u[k]
        free, rooms, groups = self.free, self.room, self.groups[k]
        for j in range(len(ap)):
            y = yk[j]
            if y >= acap[j]:
                continue
            # headroom(k, j) > 0, inlined
            p, upi = ap[j], aupi[j]
            inst, f = acap[j] - y, free[p]
            if y * upi - uk[j] + (inst if inst < f else f) * upi > 0 and all(
                rooms[g][p] > 0 for g in groups
            ):
                continue
            out.extend([(j, o, jo) for o, jo in occupants[p] if o != k])
        return out

    def _chain_for(self, b: int) -> bool:
        """A chain of two displacements: b takes room in pool p from o1, o1 takes what it
        lost in pool q from o2 (which may be b itself, giving up room it uses less well),
        o2 covers its loss where it can.

        This is an augmenting path: it pays when the contracts value the pools
        differently (o1 gets more units, or cheaper ones, out of q than o2 does), the
        trade single exchanges cannot make because o1 has no room of its own to go to.
        Estimate per instance of p, as in :meth:`_exchange_for`: b's gain, less o1's
        extra cost of covering in q, less o2's cost of covering elsewhere."""
        if self.chain_tries >= _MAX_CHAIN_TRIES:
            return False  # what the loop below ends with, whatever the candidates
        margin = self._margin(b)
        if margin == 0.0:
            return False
        occupants = self._occupants()  # moves that fail leave no trace: computed once
        fallbacks: dict[int, tuple[int, float, float]] = {}
        # Per o1: what covering one unit in q costs o1, plus what o2 then pays to cover
        # its units of that instance elsewhere, per unit o1 gets; cheapest first.
        onward: dict[int, list[tuple[float, int, int, int]]] = {}
        candidates = []
        for jb, o1, jo1 in self._blocked(b, occupants):
            if self.acu[b][jb] >= margin - _TOL:
                continue
            p = self.ap[b][jb]
            if o1 not in onward:
                paths = []
                for jt, o2, jo2 in self._blocked(o1, occupants):
                    if o2 == b:
                        value = margin
                    else:
                        if o2 not in fallbacks:
                            fallbacks[o2] = self._fallbacks(o2)
                        first_pool, first, second = fallbacks[o2]
                        value = second if self.ap[o1][jt] == first_pool else first
                    top = self.u[o2][jo2] - (self.y[o2][jo2] - 1) * self.aupi[o2][jo2]
                    loss = top * value - self.ac[o2][jo2]
                    paths.append((self.acu[o1][jt] + loss / self.aupi[o1][jt], jt, o2, jo2))
                paths.sort()
                onward[o1] = paths
            # Per instance of p: b's gain, plus o1's saving there, less o1's units
            # (moved) at the onward cost per unit.
            base = self.aupi[b][jb] * margin - self.ac[b][jb] + self.ac[o1][jo1]
            moved = self.aupi[o1][jo1]
            for n, (per_unit, jt, o2, jo2) in enumerate(onward[o1]):
                net = base - moved * per_unit
                if net <= _TOL or n >= _MAX_CHAINS:
                    break
                if self.ap[o1][jt] != p:
                    candidates.append((-net, jb, o1, jo1, jt, o2, jo2))
        # Most promising first; the estimate is rough, so only the best few are tried.
        candidates.sort()
        dearest = self._dearest_units(b)
        for _, jb, o1, jo1, jt, o2, jo2 in candidates[:_MAX_CHAINS]:
            # Free one instance of p, as many as one instance of q replaces, or as many as
            # b's dearest units need.
            per_q = self.aupi[o1][jt] // self.aupi[o1][jo1]
            wanted = min(-(-dearest // self.aupi[b][jb]), self.y[o1][jo1])
            steps = [(b, jb, o1, jo1), (o1, jt, o2, jo2)]
            for first in sorted({1, max(1, per_q), wanted}):
                if self.chain_tries >= _MAX_CHAIN_TRIES:
                    return False
                self.chain_tries += 1
                if self._try(partial(self._chain, steps, first)):
                    return True
        return False

    def _chain(self, steps: list[tuple[int, int, int, int]], first: int) -> None:
        """Run (taker, its arc, occupant, its arc) steps: the occupant gives up ``first``
        instances (later steps: as many as the taker lost in the step before), the taker
        shifts into the room; then everyone involved covers what it still needs."""
        before: dict[int, int] = {}
        for i, (taker, jt, occupant, jo) in enumerate(steps):
            n = first
            if i:  # the taker covers what it lost in the step before
                lost = self.left[taker] - before[taker]
                n = max(1, -(-lost // self.aupi[taker][jt]))
            before.setdefault(occupant, self.left[occupant])
            y, u, upi = self.y[occupant][jo], self.u[occupant][jo], self.aupi[occupant][jo]
            self.add(occupant, jo, min(u, max(0, y - n) * upi) - u)
            self._shift(taker, jt)
        for taker, _, occupant, _ in steps:
            self.fill(occupant)
            self.fill(taker)

    def _shift(self, k: int, j: int) -> None:
        """Move contract k's dearest units onto arc j while it has room: first the
        shortfall, then units on arcs that cost more per unit than j."""
        x = min(self.headroom(k, j), self.left[k])
        if x > 0:
            self.add(k, j, x)
        floor = self.acu[k][j] + _TOL
        while (room := self.headroom(k, j)) > 0:
            dearest, worst = -1, floor
            for r, u in enumerate(self.u[k]):
                if u and self.acu[k][r] > worst:
                    dearest, worst = r, self.acu[k][r]
            if dearest < 0:
                return
            m = min(room, self.u[k][dearest])
            self.add(k, dearest, -m)
            self.add(k, j, m)

    def _drop(self, k: int, j: int, units: int) -> None:
        self.add(k, j, -units)
        self.fill(k, skip_pool=self.ap[k][j])

    def _exchange(self, a: int, ja: int, b: int, jb: int, n: int) -> None:
        u = self.u[a][ja]
        self.add(a, ja, min(u, (self.y[a][ja] - n) * self.aupi[a][ja]) - u)
        self._shift(b, jb)
        self.fill(a)

    def _try(self, move: Callable[[], None]) -> bool:
        """Apply ``move``; keep it if it lowers (shortfall, cost), else undo it."""
        self.tries += 1
        before = self.objective()
        self.log = []
        move()
        log, self.log = self.log, None
        after = self.objective()
        if after[0] < before[0] or (after[0] == before[0] and after[1] < before[1] - _TOL):
            return True
        for k, j, x in reversed(log):
            self.add(k, j, -x)
        self.cost = before[1]  # drop the rounding noise of the undo
        return False

    # -- result ---------------------------------------------------------------------------

    def result(self) -> Plan:
        allocations = []
        outcomes = []
        total = 0.0
        for k, c in enumerate(self.contracts):
            planned = 0
            for j in sorted(range(len(self.ap[k])), key=lambda j: self.ap[k][j]):
                y = self.y[k][j]
                if y == 0:
                    continue
                pool = self.pools[self.ap[k][j]]
                cost = y * self.ac[k][j]
                total += cost
                planned += self.u[k][j]
                allocations.append(
                    Allocation(
                        contract=c.contract,
                        pool_id=pool.pool_id,
                        hall=pool.hall,
                        instances=y,
                        units=self.u[k][j],
                        cost_per_hour=cost,
                    )
                )
            target, held = self.target[k], self.held[k]
            outcomes.append(
                ContractOutcome(
                    contract=c.contract,
                    demand_units=c.demand_units,
                    target_units=target,
                    held_units=held,
                    planned_units=planned,
                    shortfall_units=max(0, target - held - planned),
                    surplus_units=max(0, held - target),
                )
            )
        return Plan(allocations=allocations, outcomes=outcomes, cost_per_hour=total)


def _check_unique(names: Sequence[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate {what} {name!r}")
        seen.add(name)


def plan(inp: PlanInput) -> Plan:
    """The cheapest plan found for ``inp``: least shortfall first, then least cost.

    1. Greedy with regret ordering (:meth:`_Solver.greedy`), each contract's step taking
       whole instances or finishing with a partly used one, whichever costs less per unit.
    2. Local search (:meth:`_Solver.improve`): exchanges of pool room between two
       contracts, drops of dear tails, and two-step chains of displacements; a move is
       kept only if it lowers (shortfall, cost). Bounded in passes, moves and tries.
    3. When that search was short (a small or easy problem), the same from a plain
       cheapest-first greedy, keeping the better plan.

    Same input, same plan: no clock, no randomness, and ties go by contract name and
    pool id. Raises ValueError for duplicate pool ids or contract names, or for existing
    instances in a pool that is not in ``inp.pools`` (pass excluded pools with
    ``excluded=True`` rather than leaving them out).
    """
    solver = _Solver(inp)
    solver.greedy()
    solver.improve()
    if solver.tries <= _SECOND_START_TRIES:
        other = _Solver(inp)
        other.greedy(regret_order=False)
        other.improve()
        if other.objective() < solver.objective():
            solver = other
    return solver.result()
