"""Lost work per drain in the ledger: what each drained workload had to do again.

A node agent's drain report (`drain_finished`, agent.drain.DrainReport.as_event, on NATS
`sco.<region>.drain.<hall>.<node>` and in its journal) holds one outcome per workload with
its lost training steps, Spark tasks to rerun and requeued run time. Each outcome is one
row here, keyed by (node, notice, workload) so a report read twice is one row (the table is
a ReplacingMergeTree read with FINAL, as the lifecycle table) and no node's report can
replace another node's row.

A report crosses a trust boundary (a node, and the workloads on it, write it), so it is
bounded before it is parsed (`check_raw`: size, and nesting depth by contracts/bounded.py,
the one depth check of everything that crosses a boundary) and validated after
(`DrainReportIn`: types, lengths, counts non-negative, finite and below maxima that fit
the Int64/Float64 columns, a time ClickHouse can store). Whatever fails is a
`DrainEventError` naming why, never another exception.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from activities.ledger.store import LOST_WORK_COLUMNS, LOST_WORK_TABLE, LedgerStore, as_utc
from contracts.bounded import InputRejected, check_depth

_NAMESPACE = uuid.UUID("5b0c3f3e-8c55-4a86-9d6b-3c1f0d0e2a17")
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
    """Not a drain report the ledger takes; the message names the field or the limit, and
    `kind` (a metric label) which rule refused it."""

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


#: Bounds on what one report may hold. A real report is a few hundred bytes per workload;
#: these leave room for a node of a thousand workloads and nothing near what breaks a parser.
MAX_REPORT_BYTES = 256 * 1024
MAX_DEPTH = 8  # a report is 3 deep: report -> workloads -> outcome
MAX_WORKLOADS = 1000
#: Counts below these fit Int64/Float64 with room to sum a year of drains.
MAX_LOST_STEPS = 10**12
MAX_LOST_TASKS = 10**9
MAX_LOST_SECONDS = 10.0**8  # ~3 years of run time
#: A drain is booked at when it finished: not before the stream's week (plus slack), and
#: not in the future beyond clock skew (ClickHouse's DateTime64 also ends in 2299).
MAX_AGE = timedelta(days=31)
MAX_AHEAD = timedelta(days=1)

_Name = Annotated[str, StringConstraints(min_length=1, max_length=256)]
_Short = Annotated[str, StringConstraints(max_length=64)]
_Time = Annotated[str, StringConstraints(max_length=64)]


class WorkloadLoss(BaseModel):
    """One workload's outcome, as far as the ledger reads it."""

    model_config = ConfigDict(extra="ignore", strict=True)

    workload: _Name
    contract: Annotated[str, StringConstraints(max_length=128)] | None = None
    action: _Short
    result: _Short
    lost_steps: Annotated[int, Field(ge=0, le=MAX_LOST_STEPS)] | None = None
    lost_tasks: Annotated[int, Field(ge=0, le=MAX_LOST_TASKS)] | None = None
    lost_seconds: Annotated[float, Field(ge=0, le=MAX_LOST_SECONDS, allow_inf_nan=False)] | None = (
        None
    )


class DrainReportIn(BaseModel):
    """A `drain_finished` report, validated. `node` in the body is only compared with the
    node that sent it (the NATS subject); it never decides whose row is written."""

    model_config = ConfigDict(extra="ignore", strict=True)

    event: Literal["drain_finished"]
    notice_id: _Name
    node: _Name | None = None
    finished_at: _Time = ""
    deadline: _Time = ""
    workloads: Annotated[list[WorkloadLoss], Field(max_length=MAX_WORKLOADS)] = []

    def occurred_at(self, now: datetime) -> datetime:
        text = self.finished_at or self.deadline
        try:
            at = as_utc(datetime.fromisoformat(text))
        except ValueError as exc:
            raise DrainEventError(f"finished_at/deadline {text[:64]!r}: {exc}", "time") from None
        if not now - MAX_AGE <= at <= now + MAX_AHEAD:
            raise DrainEventError(
                f"finished_at {at.isoformat()}: outside {MAX_AGE.days} days back "
                f"and {MAX_AHEAD.days} day ahead of {now:%Y-%m-%dT%H:%M}Z",
                "time",
            )
        return at


def check_raw(data: bytes) -> None:
    """Size and nesting depth, before anything parses `data` (DrainEventError)."""
    if len(data) > MAX_REPORT_BYTES:
        raise DrainEventError(f"oversized: {len(data)} bytes > {MAX_REPORT_BYTES}", "oversized")
    try:
        check_depth(data, MAX_DEPTH)
    except InputRejected as exc:
        raise DrainEventError(str(exc), "too_deep") from None


def _no_constant(name: str) -> float:
    raise DrainEventError(f"{name} is not a number a report may hold", "not_json")


def parse_event(data: bytes) -> dict[str, Any]:
    """A bounded message as a JSON object (DrainEventError when it is none)."""
    check_raw(data)
    try:
        event = json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, huge ints
        raise DrainEventError(f"not JSON: {str(exc)[:200]}", "not_json") from None
    if not isinstance(event, dict):
        raise DrainEventError(f"not a JSON object: {type(event).__name__}", "not_json")
    return event


def validate_drain(event: Mapping[str, Any], *, node: str | None = None) -> DrainReportIn:
    """`event` as a drain report within bounds; `node` (the sender NATS authenticated)
    must be the node the body names, when it names one."""
    try:
        report = DrainReportIn.model_validate(event)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise DrainEventError(
            f"drain report {str(event.get('notice_id'))[:80]!r}: {where}: {first['msg']}"
            + (f" ({len(exc.errors())} errors)" if len(exc.errors()) > 1 else "")
        ) from None
    if node is not None and report.node is not None and report.node != node:
        raise DrainEventError(
            f"drain report names node {report.node[:80]!r} but was sent by {node!r}", "forged"
        )
    return report


def rows_from_drain(
    event: Mapping[str, Any],
    region: str,
    *,
    node: str | None = None,
    now: datetime | None = None,
) -> list[list[Any]]:
    """The ledger rows of one drain report; `node`: the sender, when an authenticated
    transport says who it is (else the body's node)."""
    if event.get("event") != "drain_finished":
        raise DrainEventError(
            f"event: expected drain_finished, got {str(event.get('event'))[:64]!r}"
        )
    report = validate_drain(event, node=node)
    sender = node if node is not None else report.node
    if sender is None:
        raise DrainEventError(f"drain report {report.notice_id[:80]!r}: no node")
    at = report.occurred_at(now or datetime.now(UTC))
    rows = []
    for w in report.workloads:
        seconds = w.lost_seconds
        assert seconds is None or math.isfinite(seconds)
        rows.append(
            [
                uuid.uuid5(_NAMESPACE, f"{sender}/{report.notice_id}/{w.workload}"),
                at,
                region,
                sender,
                report.notice_id,
                w.contract or "(no contract)",
                w.workload,
                w.action,
                w.result,
                w.lost_steps,
                w.lost_tasks,
                seconds,
            ]
        )
    return rows


def insert_drain(
    store: LedgerStore, event: Mapping[str, Any], region: str, *, node: str | None = None
) -> int:
    rows = rows_from_drain(event, region, node=node)
    with store.session() as client:  # the session ensures the table (store.py)
        if rows:
            client.insert(LOST_WORK_TABLE, rows, column_names=[n for n, _ in LOST_WORK_COLUMNS])
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
    with store.read_session() as client:
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
