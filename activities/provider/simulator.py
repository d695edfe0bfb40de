"""A simulated cloud behind the provider interface, for scale and benchmarks.

The real OpenStack test cloud is the truth for API behaviour; this serves thousands of
instances with a latency model, pool capacity from the region file, committed capacity
per hall, reclaim processes (Poisson base rate plus correlated bursts), hall failures
and 429/5xx injection. It is also a recording fake: `fail_next` queues an error for the
next call, and `calls` records every call.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from activities.provider.errors import (
    InsufficientCapacity,
    NotFound,
    Permanent,
    ProviderError,
    RateLimited,
    Transient,
)
from activities.provider.interface import (
    OWNER_KEY,
    CreateRequest,
    InstanceStatus,
    ProviderInstance,
    ReclaimDecision,
    Reservation,
    ReservationRequest,
)
from activities.provider.leases import check_lease_name, parse_lease_name
from contracts.region import Pool, Region


def lease_owner(name: str) -> str:
    parsed = parse_lease_name(name)
    return parsed.owner if parsed else ""


@dataclass
class Faults:
    """Injected failures, as probabilities per call (seeded, so runs repeat)."""

    rate_limit: float = 0.0
    retry_after_s: float = 1.0
    server_error: float = 0.0


@dataclass
class Latency:
    """API latency per call and time from create to ACTIVE, in seconds."""

    api_s: float = 0.0
    boot_s: float = 0.0


@dataclass
class ReclaimModel:
    """Reclaims per pool: independent ones at `base_per_instance_hour`, plus bursts that
    take `burst_fraction` of the pool's instances within `burst_window_s` (public spot
    data: >92 % of co-interruptions in a pool fall within 3 minutes)."""

    base_per_instance_hour: float = 0.02
    bursts_per_pool_hour: float = 0.01
    burst_fraction: float = 0.3
    burst_window_s: float = 180.0

    def sample(
        self, instances: list[str], hours: float, rng: random.Random
    ) -> list[tuple[float, str]]:
        """(seconds from now, instance) reclaims over the next `hours`, sorted by time."""
        out: list[tuple[float, str]] = []
        horizon = hours * 3600
        for name in instances:
            t = (
                rng.expovariate(self.base_per_instance_hour / 3600)
                if self.base_per_instance_hour
                else horizon + 1
            )
            if t < horizon:
                out.append((t, name))
        t = 0.0
        while self.bursts_per_pool_hour and instances:
            t += rng.expovariate(self.bursts_per_pool_hour / 3600)
            if t >= horizon:
                break
            k = max(1, round(len(instances) * self.burst_fraction))
            for name in rng.sample(instances, min(k, len(instances))):
                out.append((t + rng.uniform(0, self.burst_window_s), name))
        return sorted(out)


@dataclass
class _Instance:
    info: ProviderInstance
    ready_at: float
    pool: Pool
    reservation: str | None
    fate: InstanceStatus = InstanceStatus.ACTIVE  # ERROR: the boot fails; BUILD: it hangs


@dataclass
class _Lease:
    reservation: Reservation
    used: int = 0


@dataclass
class SimulatedCloud:
    region: Region
    latency: Latency = field(default_factory=Latency)
    faults: Faults = field(default_factory=Faults)
    seed: int = 0
    clock: Callable[[], float] = field(default_factory=lambda: asyncio.get_event_loop().time)
    reclaims: ReclaimModel | None = None  # None: the simulated provider never reclaims
    # Status of a new lease: ACTIVE at once, or e.g. PENDING for a lease that never starts.
    lease_status: str = "ACTIVE"

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._by_id: dict[str, _Instance] = {}
        self._by_name: dict[str, str] = {}
        self._used: Counter[str] = Counter()
        self._leases: dict[str, _Lease] = {}
        self._committed_used: Counter[str] = Counter()  # vCPU per hall
        self._halls_down: set[str] = set()
        self._queued: list[ProviderError] = []
        self._fates: list[InstanceStatus] = []
        self._next_id = 0
        self.calls: Counter[str] = Counter()
        # What each create passed as user-data, by instance name: what cloud-init would run.
        self.user_data: dict[str, str | None] = {}
        self._reclaim_due: list[tuple[float, str]] = []  # (clock time, provider id)
        self._planned: list[ReclaimDecision] = []  # known ahead, told once with their time
        self._reclaim_sampled_until: float | None = None

    # -- fault control -------------------------------------------------------------------

    def fail_next(self, error: ProviderError) -> None:
        self._queued.append(error)

    def fail_hall(self, hall: str) -> None:
        """The hall is lost: its instances stop answering, nothing new starts there."""
        self._halls_down.add(hall)

    def restore_hall(self, hall: str) -> None:
        self._halls_down.discard(hall)

    def fail_boots(self, n: int, fate: InstanceStatus = InstanceStatus.ERROR) -> None:
        """The next `n` creates boot into `fate`: ERROR (the boot fails on its host) or
        BUILD (the boot never finishes)."""
        self._fates += [fate] * n

    async def _call(self, name: str) -> None:
        self.calls[name] += 1
        if self.latency.api_s:
            await asyncio.sleep(self.latency.api_s)
        if self._queued:
            raise self._queued.pop(0)
        if self.faults.rate_limit and self._rng.random() < self.faults.rate_limit:
            raise RateLimited(f"429 Too Many Requests ({name})", self.faults.retry_after_s)
        if self.faults.server_error and self._rng.random() < self.faults.server_error:
            raise Transient(f"503 Service Unavailable ({name})")

    # -- instances -----------------------------------------------------------------------

    def _pool(self, pool_id: str) -> Pool:
        try:
            return self.region.pool(pool_id)
        except KeyError as exc:
            raise Permanent(f"unknown pool {pool_id!r}") from exc

    def _status(self, inst: _Instance) -> InstanceStatus:
        if inst.info.hall in self._halls_down or inst.fate is InstanceStatus.ERROR:
            return InstanceStatus.ERROR
        if inst.fate is InstanceStatus.BUILD:
            return InstanceStatus.BUILD
        return InstanceStatus.ACTIVE if self.clock() >= inst.ready_at else InstanceStatus.BUILD

    def _view(self, inst: _Instance) -> ProviderInstance:
        return inst.info.model_copy(update={"status": self._status(inst)})

    async def create(self, request: CreateRequest) -> ProviderInstance:
        await self._call("create")
        existing = self._by_name.get(request.name)
        if existing is not None:
            return self._view(self._by_id[existing])
        pool = self._pool(request.pool_id)
        if request.hall in self._halls_down:
            raise InsufficientCapacity(f"No valid host was found in {request.hall} (hall down)")
        if request.reservation_id is not None:
            lease = next(
                (
                    x
                    for x in self._leases.values()
                    if x.reservation.reservation_id == request.reservation_id
                ),
                None,
            )
            if lease is None or lease.reservation.status != "ACTIVE":
                raise Permanent(f"reservation {request.reservation_id} is not active")
            if lease.used >= lease.reservation.amount:
                raise InsufficientCapacity("No valid host was found: reservation is full")
            lease.used += 1
        elif self._used[request.pool_id] >= pool.reclaimable_units:
            raise InsufficientCapacity(f"No valid host was found for {request.pool_id}")
        else:
            self._used[request.pool_id] += 1
        self._next_id += 1
        info = ProviderInstance(
            # Unique across simulator runs, as a real cloud's uuids are: fleet state keeps
            # the ids of instances from earlier runs.
            provider_id=f"sim-{uuid.uuid4()}",
            name=request.name,
            pool_id=request.pool_id,
            hall=request.hall,
            status=InstanceStatus.BUILD,
            metadata={**request.metadata, OWNER_KEY: request.region},
            host=f"{self.region.id}-{request.hall.lower()}-{self._next_id % 64:02d}",
            created_at=datetime.now(UTC),
        )
        fate = self._fates.pop(0) if self._fates else InstanceStatus.ACTIVE
        inst = _Instance(
            info, self.clock() + self.latency.boot_s, pool, request.reservation_id, fate
        )
        self._by_id[info.provider_id] = inst
        self._by_name[request.name] = info.provider_id
        self.user_data[request.name] = request.user_data
        return self._view(inst)

    async def delete(self, provider_id: str) -> None:
        await self._call("delete")
        inst = self._by_id.pop(provider_id, None)
        if inst is None:
            return
        del self._by_name[inst.info.name]
        if inst.reservation is not None:
            for lease in self._leases.values():
                if lease.reservation.reservation_id == inst.reservation:
                    lease.used -= 1
        else:
            self._used[inst.info.pool_id] -= 1

    async def get(self, provider_id: str) -> ProviderInstance:
        await self._call("get")
        inst = self._by_id.get(provider_id)
        if inst is None:
            raise NotFound(f"instance {provider_id} not found")
        return self._view(inst)

    async def list_owned(self, region: str) -> list[ProviderInstance]:
        await self._call("list")
        return [
            self._view(i) for i in self._by_id.values() if i.info.metadata.get(OWNER_KEY) == region
        ]

    async def free_capacity(self, pool_id: str) -> int:
        await self._call("free_capacity")
        pool = self._pool(pool_id)
        if pool.hall in self._halls_down:
            return 0
        return max(0, pool.reclaimable_units - self._used[pool_id])

    def reclaim(self, provider_ids: list[str], at: float | None = None) -> None:
        """Decide reclaims by hand (tests, `sco sim`): due at `at` (default: now)."""
        when = self.clock() if at is None else at
        self._reclaim_due += [(when, pid) for pid in provider_ids]

    def plan_reclaim(self, provider_ids: list[str], at: datetime, reason: str) -> None:
        """A reclaim known ahead (a Blazar host lease that starts at `at`): the next
        `pending_reclaims` of the instance's hall tells it once, with its time."""
        self._planned += [
            ReclaimDecision(provider_id=p, reason=reason, at=at) for p in provider_ids
        ]

    def _sample_reclaims(self) -> None:
        """Advance the reclaim processes of every pool to now."""
        now = self.clock()
        since = self._reclaim_sampled_until
        self._reclaim_sampled_until = now
        if self.reclaims is None or since is None or now <= since:
            return
        hours = (now - since) / 3600
        for pool in self.region.pools:
            ids = self.instances_in_pool(self.region.pool_id(pool))
            if ids:
                for offset, pid in self.reclaims.sample(ids, hours, self._rng):
                    self._reclaim_due.append((since + offset, pid))

    async def pending_reclaims(self, region: str, hall: str) -> list[ReclaimDecision]:
        await self._call("pending_reclaims")
        self._sample_reclaims()
        now = self.clock()
        due: list[tuple[float, str]] = []
        later: list[tuple[float, str]] = []
        out: list[ReclaimDecision] = []
        seen: set[str] = set()
        for when, pid in sorted(self._reclaim_due):
            (due if when <= now else later).append((when, pid))
        for when, pid in due:
            inst = self._by_id.get(pid)
            if inst is None or inst.info.hall != hall or pid in seen:
                if inst is not None and inst.info.hall != hall:
                    later.append((when, pid))  # another hall's relay will ask
                continue
            seen.add(pid)
            out.append(ReclaimDecision(provider_id=pid, reason="simulated reclaim"))
        self._reclaim_due = later
        mine = [
            d
            for d in self._planned
            if (i := self._by_id.get(d.provider_id)) and i.info.hall == hall
        ]
        self._planned = [d for d in self._planned if d not in mine]
        return out + mine

    def instances_in_pool(self, pool_id: str) -> list[str]:
        return [i.info.provider_id for i in self._by_id.values() if i.info.pool_id == pool_id]

    # -- committed capacity (Blazar) -------------------------------------------------------

    def _flavor_vcpu(self, flavor: str, hall: str) -> int:
        for pool in self.region.pools_in_hall(hall):
            if pool.flavor == flavor:
                return pool.vcpu
        raise Permanent(f"unknown flavor {flavor!r}")

    async def create_reservation(self, request: ReservationRequest) -> Reservation:
        await self._call("create_reservation")
        check_lease_name(request)
        for lease in self._leases.values():
            if lease.reservation.name == request.name:
                return lease.reservation
        committed = self.region.committed.get(request.hall)
        vcpu = self._flavor_vcpu(request.flavor, request.hall) * request.amount
        if (
            committed is None
            or request.hall in self._halls_down
            or self._committed_used[request.hall] + vcpu > committed.vcpu
        ):
            raise InsufficientCapacity(f"not enough committed capacity in {request.hall}")
        self._committed_used[request.hall] += vcpu
        self._next_id += 1
        res = Reservation(
            reservation_id=f"res-{self._next_id:08d}",
            lease_id=f"lease-{self._next_id:08d}",
            name=request.name,
            hall=request.hall,
            flavor=request.flavor,
            amount=request.amount,
            status=self.lease_status,
            end=request.end,
            owner=lease_owner(request.name),
            created_at=datetime.now(UTC),
        )
        self._leases[res.lease_id] = _Lease(res)
        return res

    async def extend_reservation(self, lease_id: str, end: datetime) -> Reservation:
        await self._call("extend_reservation")
        lease = self._leases.get(lease_id)
        if lease is None:
            raise NotFound(f"lease {lease_id} not found")
        lease.reservation = lease.reservation.model_copy(update={"end": end})
        return lease.reservation

    async def delete_reservation(self, lease_id: str) -> None:
        await self._call("delete_reservation")
        lease = self._leases.pop(lease_id, None)
        if lease is not None:
            r = lease.reservation
            self._committed_used[r.hall] -= self._flavor_vcpu(r.flavor, r.hall) * r.amount

    async def list_reservations(self, region: str) -> list[Reservation]:
        await self._call("list_reservations")
        now = datetime.now(UTC)
        return [
            x.reservation
            for x in self._leases.values()
            if (x.reservation.end > now or x.reservation.status == "ACTIVE")
            and parse_lease_name(x.reservation.name, region) is not None
        ]
