"""Read-only questions the ledger answers: spend, reclaims, reclaim rates, history.

Every query reads `FINAL`, so a replayed event (same event_id) counts once even before
ClickHouse merges it away. User values are always bound parameters; the only SQL built
from strings is column names from `GROUP_KEYS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from activities.decisions import Decision
from activities.events import (
    STATE_AFTER,
    TERMINAL_STATES,
    CapacityType,
    EventKind,
    LifecycleEvent,
)
from activities.ledger.store import (
    DECISION_COLUMN_NAMES,
    DECISIONS_TABLE,
    EVENT_COLUMN_NAMES,
    TABLE,
    LedgerStore,
    as_utc,
)

#: Columns spend may be grouped by.
GROUP_KEYS: tuple[str, ...] = ("workload", "tier", "pool_id", "capacity_type", "region")

_READY = EventKind.READY.value
#: Kinds after which an instance accrues nothing (DELETE, FAIL), derived from the model.
_TERMINAL_KINDS: list[str] = sorted(
    kind.value for kind, state in STATE_AFTER.items() if state in TERMINAL_STATES
)
_NOTICE = EventKind.NOTICE.value
#: Lifecycle order, to order events that share a millisecond.
_KIND_ORDER: list[str] = [kind.value for kind in STATE_AFTER]
#: What spend needs of an instance, taken from its READY event.
_READY_ATTRIBUTES = (*GROUP_KEYS, "price_per_hour")


class SpendRow(BaseModel):
    """Spend of one group; keys not grouped by are None."""

    model_config = ConfigDict(frozen=True)

    workload: str | None = None
    tier: int | None = None
    pool_id: str | None = None
    capacity_type: CapacityType | None = None
    region: str | None = None
    instance_seconds: float
    spend: float


class ReclaimRow(BaseModel):
    """Reclaim notices of one pool in a window."""

    model_config = ConfigDict(frozen=True)

    region: str
    pool_id: str
    reclaims: int  # NOTICE events
    instances: int  # distinct instances noticed


def _window(start: datetime, end: datetime) -> dict[str, Any]:
    if end <= start:
        raise ValueError(f"empty window: end {end} is not after start {start}")
    return {
        "start": as_utc(start),
        "end": as_utc(end),
        "ready": _READY,
        "terminal": _TERMINAL_KINDS,
    }


def _instance_seconds_sql(where: str) -> str:
    """Per instance (up to `end`): when it became READY, its first terminal event, and its
    attributes as of READY, then `seconds` = [ready, terminal or end) clipped to
    [start, end). Instances never READY (e.g. FAIL before READY) drop out: they cost nothing.

    `where` is a fixed fragment from this module with bound parameters, never user text.
    """
    end = "{end:DateTime64(3, 'UTC')}"
    start = "{start:DateTime64(3, 'UTC')}"
    terminal = "{terminal:Array(String)}"
    ready = "kind = {ready:String}"

    # Aliases get an `r_` prefix: an alias equal to a column name would shadow the column
    # in WHERE and inside the other aggregates (ClickHouse resolves aliases first).
    attributes = ",\n".join(
        f"argMinIf({column}, occurred_at, {ready}) AS r_{column}" for column in _READY_ATTRIBUTES
    )
    renamed = "".join(f"r_{column} AS {column}, " for column in _READY_ATTRIBUTES)
    return f"""
    SELECT instance_id, {renamed}
        greatest(0,
            toUnixTimestamp64Milli(least(if(n_terminal > 0, stopped_at, {end}), {end}))
            - toUnixTimestamp64Milli(greatest(ready_at, {start}))
        ) / 1000.0 AS seconds
    FROM (
        SELECT
            instance_id,
            minIf(occurred_at, {ready}) AS ready_at,
            minIf(occurred_at, kind IN {terminal}) AS stopped_at,
            countIf(kind IN {terminal}) AS n_terminal,
            {attributes}
        FROM {TABLE} FINAL
        WHERE occurred_at < {end} AND {where}
        GROUP BY instance_id
        HAVING countIf({ready}) > 0
    )
    """


def _group_columns(group_by: Iterable[str]) -> list[str]:
    if isinstance(group_by, str):  # group_by="pool_id" means one key, not its letters
        group_by = (group_by,)
    columns: list[str] = []
    for key in group_by:
        if key not in GROUP_KEYS:
            raise ValueError(f"cannot group spend by {key!r}; choose from {', '.join(GROUP_KEYS)}")
        if key not in columns:
            columns.append(key)
    return columns


def spend(
    store: LedgerStore,
    *,
    start: datetime,
    end: datetime,
    group_by: Sequence[str] = ("workload",),
    region: str | None = None,
) -> list[SpendRow]:
    """Spend in [start, end): instance-seconds from READY to the first DELETE/FAIL (or
    `end`) times price_per_hour / 3600, grouped by `group_by` (a subset of GROUP_KEYS).

    Ordered by spend, largest first. With an empty `group_by` there is one total row.
    """
    columns = _group_columns(group_by)
    parameters = _window(start, end)
    where = "1"
    if region is not None:
        where = "region = {region:String}"
        parameters["region"] = region
    select = "".join(f"{column}, " for column in columns)
    group = f"GROUP BY {', '.join(columns)}" if columns else ""
    order = "".join(f", {column}" for column in columns)
    sql = f"""
        SELECT {select}sum(seconds) AS instance_seconds,
               sum(seconds * price_per_hour / 3600) AS spend
        FROM ({_instance_seconds_sql(where)})
        WHERE seconds > 0
        {group}
        ORDER BY spend DESC{order}
    """
    with store.read_session() as client:
        result = client.query(sql, parameters=parameters)
    return [SpendRow.model_validate(row) for row in result.named_results()]


def reclaims_per_pool(
    store: LedgerStore, *, start: datetime, end: datetime, region: str | None = None
) -> list[ReclaimRow]:
    """NOTICE events per pool in [start, end), most reclaimed first."""
    parameters = _window(start, end)
    parameters["notice"] = _NOTICE
    region_filter = ""
    if region is not None:
        region_filter = "AND region = {region:String}"
        parameters["region"] = region
    sql = f"""
        SELECT region, pool_id, count() AS reclaims, uniqExact(instance_id) AS instances
        FROM {TABLE} FINAL
        WHERE kind = {{notice:String}}
          AND occurred_at >= {{start:DateTime64(3, 'UTC')}}
          AND occurred_at < {{end:DateTime64(3, 'UTC')}}
          {region_filter}
        GROUP BY region, pool_id
        ORDER BY reclaims DESC, region, pool_id
    """
    with store.read_session() as client:
        result = client.query(sql, parameters=parameters)
    return [ReclaimRow.model_validate(row) for row in result.named_results()]


def reclaim_rate(
    store: LedgerStore, *, pool_ids: Iterable[str], start: datetime, end: datetime
) -> dict[str, float]:
    """Reclaims per instance-hour of each pool in [start, end); 0.0 without running time.
    On a store with `reads_in_child` and an on-disk chDB ledger, asked of the process that
    holds the ledger (activities/ledger/holder.py), else of a child process."""
    pools = sorted(set(pool_ids))
    if not pools:
        return {}
    if store.reads_in_child and store.path is not None:
        from activities.ledger.child import rate_request, reclaim_rate_in_child
        from activities.ledger.holder import ask_holder

        # The process holding the ledger (the consumer) answers without letting it go.
        request = rate_request(store, pool_ids=pools, start=start, end=end)
        answered = ask_holder(store, request)
        return reclaim_rate_in_child(store, request) if answered is None else answered
    parameters = _window(start, end)
    parameters["pools"] = pools
    parameters["notice"] = _NOTICE
    hours_sql = f"""
        SELECT pool_id, sum(seconds) / 3600 AS hours
        FROM ({_instance_seconds_sql("pool_id IN {pools:Array(String)}")})
        GROUP BY pool_id
    """
    notices_sql = f"""
        SELECT pool_id, count() AS reclaims
        FROM {TABLE} FINAL
        WHERE kind = {{notice:String}} AND pool_id IN {{pools:Array(String)}}
          AND occurred_at >= {{start:DateTime64(3, 'UTC')}}
          AND occurred_at < {{end:DateTime64(3, 'UTC')}}
        GROUP BY pool_id
    """
    with store.read_session() as client:
        hours = {str(p): float(h) for p, h in client.query(hours_sql, parameters).result_rows}
        notices = {str(p): int(n) for p, n in client.query(notices_sql, parameters).result_rows}
    return {
        pool: notices.get(pool, 0) / hours[pool] if hours.get(pool, 0.0) > 0 else 0.0
        for pool in pools
    }


def instance_history(store: LedgerStore, instance_id: str) -> list[LifecycleEvent]:
    """Every event of one instance (each once), oldest first."""
    sql = f"""
        SELECT {", ".join(EVENT_COLUMN_NAMES)}
        FROM {TABLE} FINAL
        WHERE instance_id = {{instance_id:String}}
        ORDER BY occurred_at, indexOf({{kinds:Array(String)}}, kind), event_id
    """
    with store.read_session() as client:
        result = client.query(sql, parameters={"instance_id": instance_id, "kinds": _KIND_ORDER})
    return [LifecycleEvent.model_validate(row) for row in result.named_results()]


def decisions(
    store: LedgerStore,
    *,
    start: datetime,
    end: datetime,
    region: str | None = None,
    kind: str | None = None,
    subject: str | None = None,
) -> list[Decision]:
    """Decisions in [start, end), newest first: who decided what, and why."""
    parameters = _window(start, end)
    filters = []
    for name, value in (("region", region), ("kind", kind), ("subject", subject)):
        if value is not None:
            filters.append(f"AND {name} = {{{name}:String}}")
            parameters[name] = value
    sql = f"""
        SELECT {", ".join(DECISION_COLUMN_NAMES)}
        FROM {DECISIONS_TABLE} FINAL
        WHERE occurred_at >= {{start:DateTime64(3, 'UTC')}}
          AND occurred_at < {{end:DateTime64(3, 'UTC')}}
          {" ".join(filters)}
        ORDER BY occurred_at DESC, event_id
    """
    with store.read_session() as client:
        result = client.query(sql, parameters=parameters)
    return [Decision.model_validate(row) for row in result.named_results()]
