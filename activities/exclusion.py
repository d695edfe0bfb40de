"""Pool exclusion I/O: the `exclusions` row the planner reads, the safety-net notice count,
the live canaries of a pool, and `notify_reclaim`, by which whoever records a NOTICE tells
the pool's exclusion workflow (starting it when needed).

The workflow (`workflows.exclusion.workflow`) is addressed by its type name here, so this
module imports no workflow code.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from psycopg.rows import class_row
from psycopg_pool import ConnectionPool
from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy

from activities.events import EventKind, InstanceState, lifecycle_topic
from workflows.exclusion.models import (
    CANARY_WORKLOAD,
    RECLAIM_NOTICED_SIGNAL,
    WORKFLOW_TYPE,
    ExclusionConfig,
    PoolState,
    ReclaimNoticed,
    exclusion_input,
    exclusion_workflow_id,
)

_LIVE = [
    InstanceState.REQUESTED,
    InstanceState.ACTIVE,
    InstanceState.NOTICED,
    InstanceState.DRAINING,
]


class SetStateInput(BaseModel):
    pool_id: str
    state: PoolState
    reason: str = ""
    strikes: int = 0
    excluded_until: datetime | None = None
    set_by: str = "cycle"


class PoolRef(BaseModel):
    pool_id: str


class ExclusionRow(BaseModel):
    pool_id: str
    state: PoolState
    reason: str
    strikes: int
    excluded_until: datetime | None
    set_by: str
    updated_at: datetime


class LoadStateOutput(BaseModel):
    row: ExclusionRow | None = None


class CountNoticesInput(BaseModel):
    region: str
    pool_id: str
    window_seconds: float


class NoticeSeen(BaseModel):
    instance_id: str
    age_seconds: float
    """By the database's clock: the workflow stamps it `workflow.now() - age`, so the two
    clocks never need to agree."""


class CountNoticesOutput(BaseModel):
    notices: list[NoticeSeen] = []


class Canary(BaseModel):
    instance_id: str
    provider_id: str | None = None
    state: InstanceState


class CanariesOutput(BaseModel):
    canaries: list[Canary] = []


class ExclusionActivities:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    @activity.defn(name="exclusion.set_state")
    def set_state(self, inp: SetStateInput) -> None:
        """Upsert the pool's exclusions row; idempotent (a retry writes the same row)."""
        with self._pool.connection() as conn:
            conn.execute(
                """INSERT INTO exclusions (pool_id, state, reason, strikes, excluded_until,
                       set_by)
                   VALUES (%(pool_id)s, %(state)s, %(reason)s, %(strikes)s,
                       %(excluded_until)s, %(set_by)s)
                   ON CONFLICT (pool_id) DO UPDATE SET
                       state = excluded.state, reason = excluded.reason,
                       strikes = excluded.strikes, excluded_until = excluded.excluded_until,
                       set_by = excluded.set_by, updated_at = now()""",
                {**inp.model_dump(), "state": inp.state.value},
            )

    @activity.defn(name="exclusion.load_state")
    def load_state(self, inp: PoolRef) -> LoadStateOutput:
        """The pool's exclusions row, if any (adopted by a workflow that starts fresh)."""
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(ExclusionRow))
            row = cur.execute(
                "SELECT * FROM exclusions WHERE pool_id = %s", (inp.pool_id,)
            ).fetchone()
        return LoadStateOutput(row=row)

    @activity.defn(name="exclusion.count_notices")
    def count_notices(self, inp: CountNoticesInput) -> CountNoticesOutput:
        """NOTICE lifecycle events of the pool within the window, one per instance, from
        the outbox (rows are kept a day, far past any window)."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                """SELECT payload->>'instance_id',
                          extract(epoch FROM now() - min(created_at))
                   FROM outbox
                   WHERE topic = %s AND payload->>'kind' = %s AND payload->>'pool_id' = %s
                     AND created_at >= now() - make_interval(secs => %s)
                   GROUP BY 1 ORDER BY 2 DESC""",
                (
                    lifecycle_topic(inp.region),
                    EventKind.NOTICE.value,
                    inp.pool_id,
                    inp.window_seconds,
                ),
            ).fetchall()
        return CountNoticesOutput(
            notices=[NoticeSeen(instance_id=r[0], age_seconds=max(0.0, float(r[1]))) for r in rows]
        )

    @activity.defn(name="exclusion.canaries")
    def canaries(self, inp: PoolRef) -> CanariesOutput:
        """Canaries of the pool still alive in fleet state (this probe's, or one a
        terminated workflow left behind)."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                """SELECT instance_id, provider_id, state FROM instances
                   WHERE pool_id = %s AND workload = %s AND state = ANY(%s)
                   ORDER BY instance_id""",
                (inp.pool_id, CANARY_WORKLOAD, [s.value for s in _LIVE]),
            ).fetchall()
        return CanariesOutput(
            canaries=[
                Canary(instance_id=r[0], provider_id=r[1], state=InstanceState(r[2])) for r in rows
            ]
        )


def list_exclusions(pool: ConnectionPool, region: str | None = None) -> list[ExclusionRow]:
    """Exclusions rows (of one region, or all), for operators."""
    with pool.connection() as conn:
        cur = conn.cursor(row_factory=class_row(ExclusionRow))
        return cur.execute(
            """SELECT e.* FROM exclusions e JOIN pools p USING (pool_id)
               WHERE %(region)s::text IS NULL OR p.region = %(region)s
               ORDER BY e.pool_id""",
            {"region": region},
        ).fetchall()


def exclusion_activities(acts: ExclusionActivities) -> list[Callable[..., Any]]:
    """Every activity of the pool exclusion cycle, for a worker to register."""
    return [acts.set_state, acts.load_state, acts.count_notices, acts.canaries]


async def ensure_exclusion(
    client: Client,
    task_queue: str,
    pool_id: str,
    config: ExclusionConfig | None = None,
) -> WorkflowHandle[object, None]:
    """Start the pool's exclusion workflow unless it runs already; its handle."""
    handle: WorkflowHandle[object, None] = await client.start_workflow(
        WORKFLOW_TYPE,
        exclusion_input(pool_id, config),
        id=exclusion_workflow_id(pool_id),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return handle


async def notify_reclaim(
    client: Client,
    region: str,
    task_queue: str,
    pool_id: str,
    instance_id: str,
    at: datetime,
    *,
    config: ExclusionConfig | None = None,
) -> None:
    """Tell the pool's exclusion workflow an instance got a reclaim notice (signal-with-
    start: the workflow is started when not running). Idempotent: notices are deduplicated
    by instance id. `config` applies only when this starts the workflow."""
    inp = exclusion_input(pool_id, config)
    if inp.region != region:
        raise ValueError(f"pool {pool_id} is not in region {region}")
    await client.start_workflow(
        WORKFLOW_TYPE,
        inp,
        id=exclusion_workflow_id(pool_id),
        task_queue=task_queue,
        start_signal=RECLAIM_NOTICED_SIGNAL,
        start_signal_args=[ReclaimNoticed(instance_id=instance_id, at=at)],
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
