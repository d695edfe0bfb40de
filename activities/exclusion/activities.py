"""Pool exclusion I/O: the `exclusions` row the planner reads, the safety-net notice count,
the live canaries of a pool, and `notify_reclaim`, by which whoever records a NOTICE tells
the pool's exclusion workflow (starting it when needed).

The workflow (`workflows.exclusion.workflow`) is addressed by its type name here, so this
module imports no workflow code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg.rows import class_row
from psycopg_pool import ConnectionPool
from temporalio import activity

from activities.events import EventKind, InstanceState, lifecycle_topic
from activities.exclusion.models import (
    CANARY_WORKLOAD,
    CanariesOutput,
    Canary,
    CountNoticesInput,
    CountNoticesOutput,
    ExclusionRow,
    LoadStateOutput,
    NoticeSeen,
    PoolRef,
    SetStateInput,
)

_LIVE = [
    InstanceState.REQUESTED,
    InstanceState.ACTIVE,
    InstanceState.NOTICED,
    InstanceState.DRAINING,
]


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
