"""Lost work per drain in the ledger: what each drained workload had to do again.

A node agent's drain report (`drain_finished`, agent.drain.DrainReport.as_event, on NATS
`sco.<region>.drain.<hall>.<node>` and in its journal) holds one outcome per workload with
its lost training steps, Spark tasks to rerun and requeued run time. Each outcome is one
row here, keyed by (notice, workload) so a report read twice is one row (the table is a
ReplacingMergeTree read with FINAL, as the lifecycle table).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from activities.ledger.store import LedgerStore, as_utc

LOST_WORK_TABLE = "lost_work"
_NAMESPACE = uuid.UUID("5b0c3f3e-8c55-4a86-9d6b-3c1f0d0e2a17")
_COLUMNS = (
    ("event_id", "UUID"),
    ("occurred_at", "DateTime64(3, 'UTC')"),
    ("region", "LowCardinality(String)"),
    ("node", "String"),
    ("notice_id", "String"),
    ("workload", "LowCardinality(String)"),  # the contract, as in the lifecycle table
    ("job", "String"),  # the scheduler's id of the drained workload
    ("action", "LowCardinality(String)"),
    ("result", "LowCardinality(String)"),
    ("lost_steps", "Nullable(Int64)"),
    ("lost_tasks", "Nullable(Int64)"),
    ("lost_seconds", "Nullable(Float64)"),
)
_DDL = "".join(f"    {n} {t},\n" for n, t in _COLUMNS)
_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {LOST_WORK_TABLE} (
{_DDL}    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(occurred_at)
ORDER BY event_id
"""
BY = {"workload": "workload", "job": "job", "node": "node", "result": "result"}


class LostWorkRow(BaseModel):
    key: str
    drains: int
    workloads: int
    lost_steps: int
    lost_tasks: int
    lost_seconds: float
    unknown: int  # outcomes whose loss the workload or scheduler could not say


class DrainEventError(ValueError):
    """Not a drain report; the message names the field."""


def rows_from_drain(event: Mapping[str, Any], region: str) -> list[list[Any]]:
    if event.get("event") != "drain_finished":
        raise DrainEventError(f"event: expected drain_finished, got {event.get('event')!r}")
    try:
        notice, node = str(event["notice_id"]), str(event["node"])
        at = datetime.fromisoformat(str(event.get("finished_at") or event["deadline"]))
        rows = []
        for w in event["workloads"]:
            key = f"{notice}/{w['workload']}"
            rows.append(
                [
                    uuid.uuid5(_NAMESPACE, key),
                    as_utc(at),
                    region,
                    node,
                    notice,
                    w["contract"] or "(no contract)",
                    str(w["workload"]),
                    str(w["action"]),
                    str(w["result"]),
                    w.get("lost_steps"),
                    w.get("lost_tasks"),
                    w.get("lost_seconds"),
                ]
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise DrainEventError(f"drain report {event.get('notice_id')!r}: {exc!r}") from exc
    return rows


def insert_drain(store: LedgerStore, event: Mapping[str, Any], region: str) -> int:
    rows = rows_from_drain(event, region)
    with store.session() as client:
        client.command(_SCHEMA)
        if rows:
            client.insert(LOST_WORK_TABLE, rows, column_names=[n for n, _ in _COLUMNS])
    return len(rows)


def lost_work(
    store: LedgerStore,
    *,
    start: datetime,
    end: datetime,
    by: Literal["workload", "job", "node", "result"] = "workload",
) -> list[LostWorkRow]:
    """Lost work of drains in [start, end) per `by`, most lost steps first."""
    column = BY[by]
    sql = f"""
        SELECT toString({column}) AS key, uniqExact(notice_id) AS drains, count() AS workloads,
               toInt64(sum(ifNull(lost_steps, 0))) AS steps,
               toInt64(sum(ifNull(lost_tasks, 0))) AS tasks,
               toFloat64(sum(ifNull(lost_seconds, 0))) AS seconds,
               toInt64(countIf(lost_steps IS NULL AND lost_tasks IS NULL
                               AND lost_seconds IS NULL)) AS unknown
        FROM {LOST_WORK_TABLE} FINAL
        WHERE occurred_at >= {{start:DateTime64(3)}} AND occurred_at < {{end:DateTime64(3)}}
        GROUP BY key ORDER BY steps DESC, seconds DESC, key
    """
    with store.session() as client:
        client.command(_SCHEMA)
        result = client.query(sql, parameters={"start": as_utc(start), "end": as_utc(end)})
    return [
        LostWorkRow(
            key=row["key"],
            drains=row["drains"],
            workloads=row["workloads"],
            lost_steps=row["steps"],
            lost_tasks=row["tasks"],
            lost_seconds=row["seconds"],
            unknown=row["unknown"],
        )
        for row in result.named_results()
    ]
