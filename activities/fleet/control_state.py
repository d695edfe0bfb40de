"""Fleet state for the control plane: demand, acquisitions, exclusions and decisions.

The instance lifecycle lives in `repository`; this module holds what the region
controller reads each tick and what acquisitions record about themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from psycopg.rows import class_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool
from pydantic import BaseModel, field_validator

from activities.decisions import Decision
from activities.fleet import outbox

#: Acquisition states after which it holds no more in-flight work.
FINISHED_ACQUISITION_STATES = ("completed", "cancelled", "declined", "failed")


class DemandRow(BaseModel):
    workload: str
    region: str
    source: str
    units: int
    updated_at: datetime


class AcquisitionRow(BaseModel):
    acquisition_id: str
    region: str
    workload: str
    partition: int
    state: str
    requested_units: int
    requested_instances: int
    launched: int
    active: int
    failed: int
    shortfall_units: int
    pool_ids: list[str]
    detail: str
    created_at: datetime
    updated_at: datetime
    # planning.choice.ChoiceRecord as JSON (None: recorded before SCO kept its reasons);
    # kept opaque here so the commands that read fleet state never load the planner.
    choice: dict[str, Any] | None = None


class AcquisitionRecord(BaseModel):
    """What an acquisition writes about itself at start, on each change, and at the end."""

    acquisition_id: str
    region: str
    workload: str
    partition: int
    state: str
    requested_units: int
    requested_instances: int
    launched: int = 0
    active: int = 0
    failed: int = 0
    shortfall_units: int = 0
    pool_ids: list[str] = []
    detail: str = ""
    # Why these pools (planning/choice.py's ChoiceRecord, as JSON), written by the
    # acquisition's maker when it records the acquisition; None leaves a recorded one as it
    # is (the acquisition's own progress records carry none).
    choice: dict[str, Any] | None = None

    @field_validator("choice", mode="before")
    @classmethod
    def _record_as_json(cls, v: object) -> object:
        return v.model_dump(mode="json") if isinstance(v, BaseModel) else v


class ControlRepository:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    # -- demand --------------------------------------------------------------------------

    def set_demand(self, region: str, source: str, units: Mapping[str, int]) -> list[str]:
        """Set `source`'s demand for the given contracts; return the contracts that changed.

        Units of 0 remove the row. Other contracts of the source are left alone.
        """
        changed: list[str] = []
        with self._pool.connection() as conn, conn.transaction():
            for workload, n in sorted(units.items()):
                if n < 0:
                    raise ValueError(f"demand for {workload}: units must be >= 0, got {n}")
                if n == 0:
                    cur = conn.execute(
                        "DELETE FROM demand WHERE workload = %s AND region = %s AND source = %s",
                        (workload, region, source),
                    )
                else:
                    cur = conn.execute(
                        """INSERT INTO demand (workload, region, source, units)
                           VALUES (%s, %s, %s, %s)
                           ON CONFLICT (workload, region, source) DO UPDATE
                             SET units = excluded.units, updated_at = now()
                             WHERE demand.units <> excluded.units""",
                        (workload, region, source, n),
                    )
                if cur.rowcount:
                    changed.append(workload)
        return changed

    def replace_demand(self, region: str, source: str, units: Mapping[str, int]) -> list[str]:
        """Make `source`'s demand exactly `units` (absent contracts drop to 0)."""
        with self._pool.connection() as conn:
            held = [
                r[0]
                for r in conn.execute(
                    "SELECT workload FROM demand WHERE region = %s AND source = %s",
                    (region, source),
                ).fetchall()
            ]
        full = {w: 0 for w in held} | dict(units)
        return self.set_demand(region, source, full)

    def list_demand(self, region: str) -> list[DemandRow]:
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(DemandRow))
            return cur.execute(
                "SELECT * FROM demand WHERE region = %s ORDER BY workload, source", (region,)
            ).fetchall()

    def demand_by_contract(self, region: str) -> dict[str, int]:
        """A contract's demand is the sum over its sources (CLI, Slurm, Kubernetes)."""
        totals: dict[str, int] = {}
        for row in self.list_demand(region):
            totals[row.workload] = totals.get(row.workload, 0) + row.units
        return totals

    # -- acquisitions --------------------------------------------------------------------

    def record_acquisition(self, rec: AcquisitionRecord) -> None:
        """Upsert; idempotent, so a retried activity writes the same row."""
        with self._pool.connection() as conn:
            conn.execute(
                """INSERT INTO acquisitions (acquisition_id, region, workload, partition, state,
                       requested_units, requested_instances, launched, active, failed,
                       shortfall_units, pool_ids, detail, choice)
                   VALUES (%(acquisition_id)s, %(region)s, %(workload)s, %(partition)s,
                       %(state)s, %(requested_units)s, %(requested_instances)s, %(launched)s,
                       %(active)s, %(failed)s, %(shortfall_units)s, %(pool_ids)s, %(detail)s,
                       %(choice)s)
                   ON CONFLICT (acquisition_id) DO UPDATE SET
                       state = excluded.state, launched = excluded.launched,
                       active = excluded.active, failed = excluded.failed,
                       shortfall_units = excluded.shortfall_units,
                       requested_units = excluded.requested_units,
                       requested_instances = excluded.requested_instances,
                       pool_ids = excluded.pool_ids, detail = excluded.detail,
                       choice = coalesce(excluded.choice, acquisitions.choice),
                       updated_at = now()""",
                rec.model_dump() | {"choice": None if rec.choice is None else Jsonb(rec.choice)},
            )

    def open_acquisitions(self, region: str, partition: int | None = None) -> list[AcquisitionRow]:
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(AcquisitionRow))
            return cur.execute(
                """SELECT * FROM acquisitions
                   WHERE region = %s AND (%s::smallint IS NULL OR partition = %s)
                     AND state <> ALL(%s)
                   ORDER BY created_at""",
                (region, partition, partition, list(FINISHED_ACQUISITION_STATES)),
            ).fetchall()

    def get_acquisition(self, acquisition_id: str) -> AcquisitionRow | None:
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(AcquisitionRow))
            return cur.execute(
                "SELECT * FROM acquisitions WHERE acquisition_id = %s", (acquisition_id,)
            ).fetchone()

    def recorded_instances(self, acquisition_ids: Sequence[str]) -> dict[str, int]:
        """Instances each acquisition has put in fleet state so far (any state)."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                """SELECT acquisition_id, count(*) FROM instances
                   WHERE acquisition_id = ANY(%s) GROUP BY acquisition_id""",
                (list(acquisition_ids),),
            ).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def last_fallback_decline(self, region: str, workloads: Sequence[str]) -> dict[str, datetime]:
        """When each contract last had a committed fallback declined."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                """SELECT workload, max(updated_at) FROM acquisitions
                   WHERE region = %s AND workload = ANY(%s) AND detail = 'fallback:declined'
                   GROUP BY workload""",
                (region, list(workloads)),
            ).fetchall()
        return {r[0]: r[1] for r in rows}

    # -- exclusions ----------------------------------------------------------------------

    def excluded_pools(self, region: str) -> set[str]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                """SELECT e.pool_id FROM exclusions e JOIN pools p USING (pool_id)
                   WHERE p.region = %s AND e.state IN ('excluded', 'probing')""",
                (region,),
            ).fetchall()
        return {r[0] for r in rows}

    # -- surplus -------------------------------------------------------------------------

    def mark_surplus(
        self, region: str, workloads: Sequence[str], instance_ids: Sequence[str]
    ) -> dict[str, datetime]:
        """Stamp `surplus_since` on these instances (kept when already set) and clear it on
        the other instances of `workloads` (one controller partition's contracts); return
        each surplus instance's stamp."""
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(
                """UPDATE instances SET surplus_since = NULL
                   WHERE region = %s AND workload = ANY(%s) AND surplus_since IS NOT NULL
                     AND NOT (instance_id = ANY(%s))""",
                (region, list(workloads), list(instance_ids)),
            )
            rows = conn.execute(
                """UPDATE instances SET surplus_since = coalesce(surplus_since, now())
                   WHERE region = %s AND instance_id = ANY(%s)
                   RETURNING instance_id, surplus_since""",
                (region, list(instance_ids)),
            ).fetchall()
        return {r[0]: r[1] for r in rows}

    # -- decisions -----------------------------------------------------------------------

    def record_decision(self, decision: Decision) -> bool:
        """Queue the decision for the ledger; False when this event id is already queued."""
        with self._pool.connection() as conn, conn.transaction():
            return outbox.enqueue(conn, decision)
