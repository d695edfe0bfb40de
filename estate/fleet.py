"""What one policy holds in one region, minute by minute, and what it costs.

Reclaimable instances are counts per (pool, tenant); they occupy the pool's first slots
(see estate.trace), ordered by tenant, so a reclaimed slot names its victim. Committed
instances (floors, fallback, all-committed) are groups per hall. Spend accrues from launch
to release; an instance is useful (counts for its tenant) from the end of its boot.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from contracts.feasibility import units_per_instance
from contracts.model import Contract, WorkloadKind
from contracts.region import Pool, Region
from estate.trace import RegionTrace
from planning.models import ContractDemand, contract_demand


@dataclass
class Tenant:
    name: str
    contract: Contract
    demand: ContractDemand  # the planner's view, demand and holdings left empty
    upi: list[int]  # per pool: units per instance, 0 where the contract may not go
    allowed: list[int]  # pools with upi > 0
    floor_units: int
    authority: float  # committed fallback spend per hour

    @property
    def kind(self) -> WorkloadKind:
        return self.contract.kind


def tenants(region: Region, contracts: Sequence[Contract], copies: int) -> list[Tenant]:
    out = []
    for c in sorted(contracts, key=lambda c: c.name):
        if region.id not in c.regions:
            continue
        for i in range(copies):
            name = c.name if copies == 1 else f"{c.name}-{i + 1}"
            demand = contract_demand(c, region.id, 0).model_copy(update={"contract": name})
            out.append(
                Tenant(
                    name=name,
                    contract=c,
                    demand=demand,
                    upi=(upi := [_upi(c, p) for p in region.pools]),
                    allowed=[i for i, u in enumerate(upi) if u],
                    floor_units=c.floor.get(region.id, 0),
                    authority=c.max_fallback_spend_per_hour,
                )
            )
    return out


def _upi(c: Contract, pool: Pool) -> int:
    p, u = c.placement, c.unit
    if pool.sku not in p.skus or pool.size not in p.sizes or pool.hall not in p.halls:
        return 0
    return units_per_instance(u, pool)


@dataclass
class Committed:
    """Instances of one shape on a hall's committed capacity."""

    tenant: int
    hall: str
    pool: int  # the hall's pool of this shape (for its size)
    count: int
    price: float  # per instance-hour
    ready: int  # minute the group is useful from
    role: str  # "floor", "fallback" or "committed"


@dataclass
class Fleet:
    region: Region
    tenants: list[Tenant]
    committed_rate: dict[str, float]
    trace: RegionTrace
    committed_markup: float = 0.0
    """A committed instance costs at least this times its shape's spot list price."""
    warm_start: bool = False
    """What is launched or committed at minute 0 is up at minute 0."""
    now: int = 0  # the engine's minute
    held: list[dict[int, int]] = field(default_factory=list)  # pool -> tenant -> instances
    booting: dict[tuple[int, int], int] = field(default_factory=dict)
    ready_queue: list[tuple[int, int, int, int]] = field(default_factory=list)
    committed: list[Committed] = field(default_factory=list)
    taken: list[list[int]] = field(default_factory=list)  # pool -> minutes slots went back
    down: set[str] = field(default_factory=set)  # halls lost right now
    ready_minutes: set[int] = field(default_factory=set)  # committed groups come up then
    spend_reclaimable: float = 0.0  # per hour, right now
    running: int = 0  # reclaimable instances right now
    removed: int = 0  # reclaimable instances released or lost, all told
    # The control plane's work (issue 33's footprint model): a tenant's launches in one
    # minute are one acquisition (the product starts one per contract per tick).
    acquisitions: int = 0
    launched: int = 0  # reclaimable instances launched, all told
    last_launch: dict[int, int] = field(default_factory=dict)  # tenant -> minute
    spend_committed: dict[str, float] = field(default_factory=dict)  # role -> per hour
    ready_units: list[int] = field(default_factory=list)  # reclaimable, per tenant
    held_units: list[int] = field(default_factory=list)  # reclaimable, booting included
    counts: list[int] = field(default_factory=list)  # per pool
    # Accumulated.
    cost_reclaimable: float = 0.0
    cost_committed: dict[str, float] = field(default_factory=dict)
    reclaimable_minutes: float = 0.0  # instance-minutes
    pool_minutes: list[float] = field(default_factory=list)
    pool_last: list[int] = field(default_factory=list)
    pool_day_minutes: list[dict[int, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.region.pools)
        self.held = [{} for _ in range(n)]
        self.taken = [[] for _ in range(n)]
        self.ready_units = [0] * len(self.tenants)
        self.held_units = [0] * len(self.tenants)
        self.counts = [0] * n
        self._busy: tuple[int, list[int]] = (-1, [])
        self.pool_minutes = [0.0] * n
        self.pool_last = [0] * n
        self.pool_day_minutes = [{} for _ in range(n)]
        self.pools: tuple[Pool, ...] = self.region.pools
        self.price = [
            self.trace.price_at_start(i, p.price_per_hour) for i, p in enumerate(self.pools)
        ]

    # -- reclaimable --------------------------------------------------------------------

    def count(self, pool: int) -> int:
        return self.counts[pool]

    def free(self, pool: int, minute: int, hold: int) -> int:
        """Instances that can start in the pool now: its slots less the owner's own load,
        ours, and what the provider took back in the last ``hold`` minutes."""
        if self.pools[pool].hall in self.down:
            return 0
        taken = self.taken[pool]
        while taken and taken[0] + hold <= minute:
            taken.pop(0)
        if self._busy[0] != minute:
            self._busy = (
                minute,
                [
                    self.trace.owner_free(i, minute, p.reclaimable_units)
                    for i, p in enumerate(self.pools)
                ],
            )
        cap = self._busy[1][pool]
        return max(0, cap - self.counts[pool] - len(taken))

    def units(self, tenant: int) -> int:
        """Reclaimable units a tenant holds, booting ones included."""
        return self.held_units[tenant]

    def _flush(self, pool: int, minute: int) -> None:
        """Instance-minutes of the pool up to ``minute``, by day (the rate window)."""
        last, n = self.pool_last[pool], self.count(pool)
        if n and minute > last:
            self.pool_minutes[pool] += n * (minute - last)
            days = self.pool_day_minutes[pool]
            while last < minute:
                day_end = (last // 1440 + 1) * 1440
                step = min(minute, day_end) - last
                days[last // 1440] = days.get(last // 1440, 0.0) + n * step
                last += step
        self.pool_last[pool] = minute

    def launch(self, pool: int, tenant: int, n: int, minute: int, boot: int) -> None:
        if n <= 0:
            return
        self._flush(pool, minute)
        if self.last_launch.get(tenant) != minute:
            self.last_launch[tenant] = minute
            self.acquisitions += 1
        self.launched += n
        self.held[pool][tenant] = self.held[pool].get(tenant, 0) + n
        self.counts[pool] += n
        self.held_units[tenant] += n * self.tenants[tenant].upi[pool]
        if self.warm_start and minute == 0:
            boot = 0
        self.booting[(pool, tenant)] = self.booting.get((pool, tenant), 0) + n
        heapq.heappush(self.ready_queue, (minute + boot, pool, tenant, n))
        self.spend_reclaimable += n * self.price[pool]
        self.running += n

    def remove(self, pool: int, tenant: int, n: int, minute: int) -> int:
        """Release (or lose) up to n instances; ready ones go first. Returns how many."""
        have = self.held[pool].get(tenant, 0)
        n = min(n, have)
        if n <= 0:
            return 0
        self._flush(pool, minute)
        booting = self.booting.get((pool, tenant), 0)
        ready_gone = min(n, have - booting)
        boot_gone = n - ready_gone
        if boot_gone:
            self.booting[(pool, tenant)] = booting - boot_gone
        self.ready_units[tenant] -= ready_gone * self.tenants[tenant].upi[pool]
        self.held_units[tenant] -= n * self.tenants[tenant].upi[pool]
        self.counts[pool] -= n
        if have == n:
            del self.held[pool][tenant]
        else:
            self.held[pool][tenant] = have - n
        self.spend_reclaimable -= n * self.price[pool]
        self.running -= n
        self.removed += n
        return n

    def mature(self, minute: int) -> None:
        """Booted instances become useful (the newest launches in a pool keep booting)."""
        q = self.ready_queue
        while q and q[0][0] <= minute:
            _, pool, tenant, n = heapq.heappop(q)
            booting = self.booting.get((pool, tenant), 0)
            k = min(n, booting)  # some may have been released while booting
            if k:
                self.booting[(pool, tenant)] = booting - k
                self.ready_units[tenant] += k * self.tenants[tenant].upi[pool]

    def victims(self, pool: int, slots: Sequence[int]) -> list[int]:
        """Tenant of each slot that an instance of ours occupies."""
        order = sorted(self.held[pool].items())
        out = []
        for s in slots:
            acc = 0
            for tenant, n in order:
                acc += n
                if s < acc:
                    out.append(tenant)
                    break
        return out

    # -- committed ------------------------------------------------------------------------

    def set_price(self, pool: int, price: float) -> None:
        """The pool's price changes: what runs there pays the new price from now on."""
        self.spend_reclaimable += self.counts[pool] * (price - self.price[pool])
        self.price[pool] = price

    def committed_price(self, pool: int, hall: str) -> float:
        """Per instance-hour of the pool's shape on the hall's committed capacity: the
        per-vCPU rate, and at least ``committed_markup`` times the spot list price."""
        shape = self.pools[pool]
        base = shape.vcpu * self.committed_rate[hall]
        return max(base, self.committed_markup * shape.price_per_hour)

    def commit(self, group: Committed) -> None:
        if self.warm_start and self.now == 0:
            group.ready = 0
        if group.count > 0:
            self.committed.append(group)
            self.ready_minutes.add(group.ready)
            self._committed_spend(group.role, group.count * group.price)

    def uncommit(self, group: Committed, n: int) -> None:
        n = min(n, group.count)
        group.count -= n
        self._committed_spend(group.role, -n * group.price)
        if group.count == 0:
            self.committed.remove(group)

    def committed_units(self, tenant: int, role: str, minute: int | None = None) -> int:
        """Units of a tenant's committed groups of ``role``; only useful ones with a minute."""
        total = 0
        for g in self.committed:
            if g.tenant == tenant and g.role == role and (minute is None or g.ready <= minute):
                total += g.count * self.tenants[tenant].upi[g.pool]
        return total

    def committed_room(self, hall: str, pool: int) -> int:
        """Instances of the pool's shape the hall's unused committed capacity holds."""
        cap = self.region.committed.get(hall)
        if cap is None or hall in self.down:
            return 0
        vcpu, mem, gpus = cap.vcpu, cap.memory_gib, cap.gpus
        for g in self.committed:
            if g.hall == hall:
                p = self.pools[g.pool]
                vcpu -= g.count * p.vcpu
                mem -= g.count * p.memory_gib
                gpus -= g.count * p.gpus
        shape = self.pools[pool]
        fits = [vcpu // shape.vcpu, mem // shape.memory_gib]
        if shape.gpus:
            fits.append(gpus // shape.gpus)
        return max(0, min(fits))

    def _committed_spend(self, role: str, delta: float) -> None:
        self.spend_committed[role] = self.spend_committed.get(role, 0.0) + delta

    def accrue(self) -> None:
        """One minute of spend and instance time."""
        self.cost_reclaimable += self.spend_reclaimable / 60.0
        self.reclaimable_minutes += self.running
        for role, per_hour in self.spend_committed.items():
            self.cost_committed[role] = self.cost_committed.get(role, 0.0) + per_hour / 60.0

    @property
    def cost(self) -> float:
        return self.cost_reclaimable + sum(self.cost_committed.values())

    def rate(self, pool: int, notices: dict[int, int], minute: int, window_days: int) -> float:
        """Reclaims per instance-hour over the last ``window_days`` days (as the ledger's
        reclaim_rate): 0.0 without running time."""
        self._flush(pool, minute)
        today = minute // 1440
        days = self.pool_day_minutes[pool]
        hours = sum(days.get(d, 0.0) for d in range(today - window_days + 1, today + 1)) / 60
        if hours <= 0:
            return 0.0
        seen = sum(notices.get(d, 0) for d in range(today - window_days + 1, today + 1))
        return seen / hours


def shape_pools(fleet: Fleet, tenant: Tenant) -> dict[tuple[str, str], dict[str, int]]:
    """(sku, size) -> hall -> pool index, for the shapes the tenant may use."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for i, pool in enumerate(fleet.pools):
        if tenant.upi[i]:
            out.setdefault((pool.sku, pool.size), {})[pool.hall] = i
    return out


def cheapest_committed_shape(fleet: Fleet, tenant: Tenant) -> tuple[str, str] | None:
    """The floor keeper's shape rule: cheapest committed cost per unit, then the smaller
    instance, then the name."""
    rate = max(fleet.committed_rate.values(), default=1.0)
    best: tuple[float, int, str, tuple[str, str]] | None = None
    for shape, by_hall in shape_pools(fleet, tenant).items():
        i = by_hall[min(by_hall)]
        pool = fleet.pools[i]
        key = (pool.vcpu * rate / tenant.upi[i], pool.vcpu, f"{shape[0]}.{shape[1]}", shape)
        if best is None or key < best:
            best = key
    return None if best is None else best[3]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b) if b else 0
