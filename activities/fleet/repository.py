"""Fleet state repository: the only module that writes fleet-state rows.

Activities call these methods. Every instance state change writes its lifecycle event
to the outbox in the same transaction, so an event exists iff the change committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from psycopg.rows import class_row
from psycopg_pool import ConnectionPool
from pydantic import BaseModel

from activities.events import (
    STATE_AFTER,
    TERMINAL_STATES,
    CapacityType,
    EventKind,
    InstanceState,
    LifecycleEvent,
)
from activities.fleet import outbox
from contracts.region import Region

#: Allowed instance state changes; anything else is a bug or a stale writer.
_ALLOWED: dict[InstanceState, frozenset[InstanceState]] = {
    InstanceState.REQUESTED: frozenset(
        {InstanceState.ACTIVE, InstanceState.FAILED, InstanceState.DELETED}
    ),
    InstanceState.ACTIVE: frozenset(
        {InstanceState.NOTICED, InstanceState.DRAINING, InstanceState.DELETED}
    ),
    InstanceState.NOTICED: frozenset({InstanceState.DRAINING, InstanceState.DELETED}),
    InstanceState.DRAINING: frozenset({InstanceState.DELETED}),
    InstanceState.DELETED: frozenset(),
    InstanceState.FAILED: frozenset(),
}


class FleetStateError(RuntimeError):
    pass


class InvalidTransition(FleetStateError):
    """The instance is in a state from which this event is not allowed (permanent)."""


class UnknownInstance(FleetStateError):
    pass


class CommittedCapacityRefused(FleetStateError):
    """A reclaim of committed capacity (a floor's, a paid fallback's) without `force`:
    checked on the locked row, in the transaction that would have noticed it."""


class InstanceSpec(BaseModel):
    """What an acquisition knows about an instance before it exists."""

    instance_id: str
    region: str
    pool_id: str
    capacity_type: CapacityType
    workload: str
    tier: int
    acquisition_id: str | None = None
    # The rate the ledger charges; None: the pool's reclaimable price. Committed capacity
    # (fallback, floors) is priced by the region's committed rate instead.
    price_per_hour: float | None = None
    # The hostname the instance must boot with (a Slurm node name); None: any.
    hostname: str | None = None


class InstanceRow(BaseModel):
    instance_id: str
    region: str
    pool_id: str
    hall: str
    sku: str
    size: str
    capacity_type: CapacityType
    workload: str
    tier: int
    price_per_hour: float
    state: InstanceState
    provider_id: str | None
    acquisition_id: str | None
    created_at: datetime
    state_changed_at: datetime
    version: int
    surplus_since: datetime | None = None
    hostname: str | None = None


class PoolRow(BaseModel):
    pool_id: str
    region: str
    hall: str
    sku: str
    size: str
    vcpu: int
    memory_gib: int
    gpus: int
    price_per_hour: float
    reclaimable_units: int
    live_instances: int


class PlannedReclaim(BaseModel):
    """A reclaim known ahead: its early warning went out when planned, its hard notice
    goes at `reclaim_at` - the region's lead (`noticed_at` set then)."""

    instance_id: str
    region: str
    hall: str
    reclaim_at: datetime
    reason: str
    planned_at: datetime
    noticed_at: datetime | None = None


class FleetRepository:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    # -- pools ---------------------------------------------------------------------------

    def sync_pools(self, region: Region) -> int:
        """Upsert the region file's pools; return how many rows changed."""
        rows = [
            (
                region.pool_id(p),
                region.id,
                p.hall,
                p.sku,
                p.size,
                p.vcpu,
                p.memory_gib,
                p.gpus,
                p.price_per_hour,
                p.reclaimable_units,
            )
            for p in region.pools
        ]
        with self._pool.connection() as conn, conn.cursor() as cur:
            cur.executemany(
                """INSERT INTO pools (pool_id, region, hall, sku, size, vcpu, memory_gib, gpus,
                                      price_per_hour, reclaimable_units)
                   VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
                   ON CONFLICT (pool_id) DO UPDATE SET
                       vcpu = EXCLUDED.vcpu, memory_gib = EXCLUDED.memory_gib,
                       gpus = EXCLUDED.gpus, price_per_hour = EXCLUDED.price_per_hour,
                       reclaimable_units = EXCLUDED.reclaimable_units, updated_at = now()
                   WHERE (pools.vcpu, pools.memory_gib, pools.gpus, pools.price_per_hour,
                          pools.reclaimable_units)
                      IS DISTINCT FROM (EXCLUDED.vcpu, EXCLUDED.memory_gib, EXCLUDED.gpus,
                          EXCLUDED.price_per_hour, EXCLUDED.reclaimable_units)""",
                rows,
            )
            return max(cur.rowcount, 0)

    def list_pools(self, region: str, hall: str | None = None) -> list[PoolRow]:
        with self._pool.connection() as conn, conn.cursor(row_factory=class_row(PoolRow)) as cur:
            cur.execute(
                """SELECT p.pool_id, p.region, p.hall, p.sku, p.size, p.vcpu, p.memory_gib,
                          p.gpus, p.price_per_hour, p.reclaimable_units,
                          count(i.instance_id)::int AS live_instances
                   FROM pools p LEFT JOIN instances i
                     ON i.pool_id = p.pool_id AND i.state NOT IN ('deleted', 'failed')
                   WHERE p.region = %s AND (%s::text IS NULL OR p.hall = %s)
                   GROUP BY p.pool_id ORDER BY p.hall, p.sku, p.vcpu""",
                (region, hall, hall),
            )
            return cur.fetchall()

    # -- instances -----------------------------------------------------------------------

    def record_acquire(self, spec: InstanceSpec, reason: str = "") -> LifecycleEvent | None:
        """Insert the instance as REQUESTED with its ACQUIRE event.

        Idempotent: when the instance already exists nothing is written and None returns,
        so a retried activity never emits a second ACQUIRE.
        """
        with self._pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=class_row(InstanceRow))
            row = cur.execute(
                """INSERT INTO instances (instance_id, region, pool_id, hall, sku, size,
                                          capacity_type, workload, tier, price_per_hour,
                                          state, acquisition_id, hostname)
                   SELECT %s, %s, p.pool_id, p.hall, p.sku, p.size, %s, %s, %s,
                          coalesce(%s, p.price_per_hour), 'requested', %s, %s
                   FROM pools p WHERE p.pool_id = %s AND p.region = %s
                   ON CONFLICT (instance_id) DO NOTHING
                   RETURNING *""",
                (
                    spec.instance_id,
                    spec.region,
                    spec.capacity_type.value,
                    spec.workload,
                    spec.tier,
                    spec.price_per_hour,
                    spec.acquisition_id,
                    spec.hostname,
                    spec.pool_id,
                    spec.region,
                ),
            ).fetchone()
            if row is None:
                if self.get_instance(spec.instance_id) is not None:
                    return None
                raise FleetStateError(
                    f"pool {spec.pool_id!r} is not in fleet state for region {spec.region!r}; "
                    "run `sco pools sync` first"
                )
            event = _event_for(row, EventKind.ACQUIRE, reason)
            outbox.enqueue(conn, event)
            return event

    def record_event(
        self,
        instance_id: str,
        kind: EventKind,
        *,
        reason: str = "",
        provider_id: str | None = None,
        allow_committed: bool = True,
    ) -> LifecycleEvent | None:
        """Move an instance to the state `kind` leads to, with its event, atomically.

        Idempotent: when the instance is already in that state nothing is written and None
        returns. A transition the lifecycle does not allow raises InvalidTransition;
        `allow_committed=False` on a committed instance raises CommittedCapacityRefused
        (the check and the move are one transaction on the locked row).
        """
        target = STATE_AFTER[kind]
        with self._pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=class_row(InstanceRow))
            current = cur.execute(
                "SELECT * FROM instances WHERE instance_id = %s FOR UPDATE", (instance_id,)
            ).fetchone()
            if current is None:
                raise UnknownInstance(f"instance {instance_id!r} is not in fleet state")
            if current.state == target:
                return None
            if not allow_committed and current.capacity_type == CapacityType.COMMITTED:
                raise CommittedCapacityRefused(
                    f"instance {instance_id!r}: committed capacity ({current.workload}); "
                    "refused without force"
                )
            if target not in _ALLOWED[current.state]:
                raise InvalidTransition(
                    f"instance {instance_id!r}: {kind.value} is not allowed in state "
                    f"{current.state.value}"
                )
            conn.execute(
                """UPDATE instances SET state = %s, state_changed_at = now(),
                          provider_id = coalesce(%s, provider_id), version = version + 1
                   WHERE instance_id = %s""",
                (target.value, provider_id, instance_id),
            )
            event = _event_for(current, kind, reason)
            outbox.enqueue(conn, event)
            return event

    def get_instance(self, instance_id: str) -> InstanceRow | None:
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(InstanceRow))
            return cur.execute(
                "SELECT * FROM instances WHERE instance_id = %s", (instance_id,)
            ).fetchone()

    def get_instance_by_provider_id(self, provider_id: str) -> InstanceRow | None:
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(InstanceRow))
            return cur.execute(
                "SELECT * FROM instances WHERE provider_id = %s", (provider_id,)
            ).fetchone()

    def list_instances(
        self,
        region: str,
        states: Sequence[InstanceState] | None = None,
        *,
        hall: str | None = None,
        pool_id: str | None = None,
    ) -> list[InstanceRow]:
        wanted = [s.value for s in states] if states else None
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(InstanceRow))
            return cur.execute(
                """SELECT * FROM instances
                   WHERE region = %(region)s
                     AND (%(states)s::text[] IS NULL OR state = ANY(%(states)s))
                     AND (%(hall)s::text IS NULL OR hall = %(hall)s)
                     AND (%(pool)s::text IS NULL OR pool_id = %(pool)s)
                   ORDER BY created_at, instance_id""",
                {"region": region, "states": wanted, "hall": hall, "pool": pool_id},
            ).fetchall()

    def live_by_hostname(self, region: str, hostnames: Sequence[str]) -> list[InstanceRow]:
        """Instances not yet DELETED or FAILED that carry one of `hostnames`."""
        terminal = [s.value for s in TERMINAL_STATES]
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(InstanceRow))
            return cur.execute(
                """SELECT * FROM instances
                   WHERE region = %s AND hostname = ANY(%s) AND NOT state = ANY(%s)
                   ORDER BY hostname, created_at""",
                (region, list(hostnames), terminal),
            ).fetchall()

    # -- planned reclaims ----------------------------------------------------------------

    def plan_reclaim(
        self, instance_id: str, reclaim_at: datetime, reason: str = ""
    ) -> PlannedReclaim | None:
        """Plan the instance's reclaim at `reclaim_at`; idempotent. Planned again while its
        hard notice is still to come, the earlier time stands. None: no such instance."""
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(PlannedReclaim))
            return cur.execute(
                """INSERT INTO planned_reclaims (instance_id, region, hall, reclaim_at, reason)
                   SELECT instance_id, region, hall, %s, %s FROM instances
                   WHERE instance_id = %s
                   ON CONFLICT (instance_id) DO UPDATE
                       SET reclaim_at = least(planned_reclaims.reclaim_at, EXCLUDED.reclaim_at)
                       WHERE planned_reclaims.noticed_at IS NULL
                   RETURNING *""",
                (reclaim_at, reason, instance_id),
            ).fetchone() or self.planned_reclaim(instance_id)

    def planned_reclaim(self, instance_id: str) -> PlannedReclaim | None:
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(PlannedReclaim))
            return cur.execute(
                "SELECT * FROM planned_reclaims WHERE instance_id = %s", (instance_id,)
            ).fetchone()

    def planned_reclaims(
        self, region: str, *, hall: str | None = None, workloads: Sequence[str] | None = None
    ) -> list[PlannedReclaim]:
        """Planned reclaims whose hard notice is still to come, soonest first (of live
        instances: a deleted instance has nothing left to reclaim)."""
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(PlannedReclaim))
            return cur.execute(
                """SELECT r.* FROM planned_reclaims r JOIN instances i USING (instance_id)
                   WHERE r.region = %(region)s AND r.noticed_at IS NULL
                     AND (%(hall)s::text IS NULL OR r.hall = %(hall)s)
                     AND (%(workloads)s::text[] IS NULL OR i.workload = ANY(%(workloads)s))
                     AND i.state NOT IN ('deleted', 'failed')
                   ORDER BY r.reclaim_at, r.instance_id""",
                {
                    "region": region,
                    "hall": hall,
                    "workloads": list(workloads) if workloads is not None else None,
                },
            ).fetchall()

    def mark_planned_noticed(self, instance_id: str) -> None:
        with self._pool.connection() as conn:
            conn.execute(
                """UPDATE planned_reclaims SET noticed_at = now()
                   WHERE instance_id = %s AND noticed_at IS NULL""",
                (instance_id,),
            )

    # -- outbox --------------------------------------------------------------------------

    def outbox_backlog(self) -> tuple[int, float]:
        with self._pool.connection() as conn:
            return outbox.pending(conn)


def _event_for(row: InstanceRow, kind: EventKind, reason: str) -> LifecycleEvent:
    """The lifecycle event for a change of this instance: its row carries every field."""
    return LifecycleEvent(
        kind=kind,
        reason=reason,
        **row.model_dump(include=_EVENT_FIELDS_FROM_ROW),
    )


_EVENT_FIELDS_FROM_ROW = {
    "instance_id",
    "region",
    "pool_id",
    "hall",
    "sku",
    "size",
    "capacity_type",
    "workload",
    "tier",
    "price_per_hour",
}
