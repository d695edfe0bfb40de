"""The region worker's gauges and histograms (prometheus_client, on `worker.state_metrics_port`).

A periodic collector feeds them from where the figures already are, never from workflow
code (workflows stay deterministic and replay-safe): the floor keepers' and the token
budget's status queries, and fleet state (open acquisitions, excluded pools, and the
lifecycle events of the outbox for the latency histograms). Each histogram observes a
fleet-state row once: the collector keeps a high-water mark, starting at what exists when
the worker starts, so a restart never observes history twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from prometheus_client import Gauge, Histogram
from psycopg_pool import ConnectionPool
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError

from activities.budget import STATUS_QUERY, BudgetStatus, budget_workflow_id
from activities.events import lifecycle_topic
from activities.floor.models import floor_workflow_id
from contracts.bundle import installed_bundle
from workers.settings import Settings
from workflows.acquisition.models import FINISHED
from workflows.floor.models import FloorState, FloorStatus
from workflows.floor.workflow import FloorKeeperWorkflow

log = logging.getLogger(__name__)


class FloorsUnanswered(Exception):
    """Floor keepers that did not answer (the others were collected)."""


_FLOOR = ["region", "contract"]
_HALL = ["region", "contract", "hall"]
FLOOR_UNITS = Gauge("sco_floor_units", "The contract's committed floor in the region", _FLOOR)
FLOOR_TARGET = Gauge("sco_floor_target_units", "Floor units the keeper aims for per hall", _HALL)
FLOOR_HELD = Gauge("sco_floor_held_units", "Floor units held (ACTIVE) per hall", _HALL)
FLOOR_STATE = Gauge(
    "sco_floor_state", "1 for the keeper's current state, 0 for the others", [*_FLOOR, "state"]
)
FLOOR_LOST_HALLS = Gauge("sco_floor_lost_halls", "Halls the keeper holds as lost", _FLOOR)
FLOOR_ANSWERING = Gauge(
    "sco_floor_answering", "1 when the floor keeper answered its status query", _FLOOR
)
BUDGET_TOKENS = Gauge("sco_budget_tokens_available", "Provider API tokens available", ["region"])
BUDGET_BURST = Gauge("sco_budget_burst", "The token bucket's size", ["region"])
BUDGET_QUEUE = Gauge("sco_budget_queue_length", "Token requests waiting", ["region"])
ACQ_OPEN = Gauge(
    "sco_acquisitions_open", "Acquisitions not finished, by state", ["region", "state"]
)
ACQ_OLDEST = Gauge(
    "sco_acquisition_oldest_open_age_seconds",
    "Age of the oldest unfinished acquisition (0: none open)",
    ["region"],
)
EXCLUDED = Gauge("sco_pools_excluded", "Pools excluded from plans", ["region", "hall"])
COLLECTOR_UP = Gauge(
    "sco_region_collector_up", "1 when the last collection read every source", ["region"]
)

_SECONDS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600)
ACQ_DURATION = Histogram(
    "sco_acquisition_duration_seconds",
    "An acquisition from its start to finished, by how it ended",
    ["region", "state"],
    buckets=_SECONDS,
)
CREATE_TO_ACTIVE = Histogram(
    "sco_instance_create_to_active_seconds",
    "An instance from its create to ACTIVE",
    ["region"],
    buckets=_SECONDS,
)
NOTICE_TO_DELETE = Histogram(
    "sco_instance_notice_to_delete_seconds",
    "An instance from its reclaim notice to its delete",
    ["region"],
    buckets=_SECONDS,
)

_OPEN_STATES = ("starting", "running", "paused", "waiting_approval", "cancelling")
_TERMINAL = [s.value for s in FINISHED]

# Lifecycle events since the mark, with the time from the instance's create (its row).
# A delete's notice time comes from the notice event the collector saw before it.
_EVENTS = """
SELECT o.id, o.key, o.payload->>'kind', (o.payload->>'occurred_at')::timestamptz,
       extract(epoch FROM (o.payload->>'occurred_at')::timestamptz - i.created_at)
FROM outbox o
JOIN instances i ON i.instance_id = o.key
WHERE o.topic = %s AND o.id > %s AND o.payload->>'kind' IN ('ready', 'notice', 'delete')
ORDER BY o.id LIMIT 10000
"""
#: Noticed instances remembered for their delete; beyond this the oldest are forgotten.
_NOTICED_MAX = 100_000


@dataclass
class _Marks:
    outbox_id: int | None = None
    finished_since: datetime | None = None
    noticed: dict[str, datetime] = field(default_factory=dict)


class RegionCollector:
    def __init__(
        self, settings: Settings, region: str, client: Client, pool: ConnectionPool
    ) -> None:
        self._s = settings
        self._region = region
        self._client = client
        self._pool = pool
        self._marks = _Marks()
        ACQ_OLDEST.labels(region)
        for state in _OPEN_STATES:
            ACQ_OPEN.labels(region, state)
        for hist in (CREATE_TO_ACTIVE, NOTICE_TO_DELETE):
            hist.labels(region)
        for state in _TERMINAL:
            ACQ_DURATION.labels(region, state)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.collect_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._s.worker.collect_seconds)

    async def collect_once(self) -> bool:
        ok = True
        for step in (self._floors, self._budget):
            try:
                await step()
            except (RPCError, WorkflowQueryFailedError, TimeoutError, FloorsUnanswered) as exc:
                ok = False
                log.warning("region metrics: %s failed: %s", step.__name__, exc)
        try:
            await asyncio.to_thread(self.collect_fleet_state)
        except psycopg.Error as exc:
            ok = False
            log.warning("region metrics: fleet state unavailable: %s", exc)
        COLLECTOR_UP.labels(self._region).set(int(ok))
        return ok

    async def _floors(self) -> None:
        bundle, _ = installed_bundle(self._s.bundle_cache_dir, self._s.trust_dir)
        contracts = (
            []
            if bundle is None
            else sorted(
                c.name
                for c in bundle.content.contracts
                if c.tier == 1 and c.floor.get(self._region, 0) > 0
            )
        )
        # One keeper that answers no query (a wedged task) is its own gauge and the rest
        # are still read: it once took every floor's metrics with it.
        unanswered: list[str] = []
        for contract in contracts:
            handle = self._client.get_workflow_handle(floor_workflow_id(self._region, contract))
            try:
                st: FloorStatus = await asyncio.wait_for(
                    handle.query(FloorKeeperWorkflow.status), timeout=10
                )
            except (RPCError, WorkflowQueryFailedError, TimeoutError) as exc:
                FLOOR_ANSWERING.labels(self._region, contract).set(0)
                unanswered.append(f"{contract}: {exc}")
                continue
            FLOOR_ANSWERING.labels(self._region, contract).set(1)
            self._floor(st)
        if unanswered:
            raise FloorsUnanswered("; ".join(unanswered))

    def _floor(self, st: FloorStatus) -> None:
        r, c = self._region, st.contract
        FLOOR_UNITS.labels(r, c).set(st.floor_units)
        FLOOR_LOST_HALLS.labels(r, c).set(len(st.lost_halls))
        for state in FloorState:
            FLOOR_STATE.labels(r, c, state.value).set(int(state == st.state))
        halls = set(st.target_units_by_hall) | set(st.held_units_by_hall) | set(st.lost_halls)
        for hall in halls:
            FLOOR_TARGET.labels(r, c, hall).set(st.target_units_by_hall.get(hall, 0))
            FLOOR_HELD.labels(r, c, hall).set(st.held_units_by_hall.get(hall, 0))

    async def _budget(self) -> None:
        handle = self._client.get_workflow_handle(budget_workflow_id(self._region))
        st: BudgetStatus = await asyncio.wait_for(
            handle.query(STATUS_QUERY, result_type=BudgetStatus), timeout=10
        )
        BUDGET_TOKENS.labels(self._region).set(st.tokens_available)
        BUDGET_BURST.labels(self._region).set(st.burst)
        BUDGET_QUEUE.labels(self._region).set(st.queued)

    def collect_fleet_state(self) -> None:
        r = self._region
        with self._pool.connection() as conn:
            self._acquisitions(conn)
            excluded = conn.execute(
                "SELECT p.hall, count(e.pool_id) FILTER (WHERE e.state = 'excluded') "
                "FROM pools p LEFT JOIN exclusions e USING (pool_id) "
                "WHERE p.region = %s GROUP BY p.hall",
                (r,),
            ).fetchall()
            for hall, n in excluded:
                EXCLUDED.labels(r, hall).set(n)
            self._latencies(conn)

    def _acquisitions(self, conn: psycopg.Connection[Any]) -> None:
        r = self._region
        open_rows = dict(
            conn.execute(
                "SELECT state, count(*) FROM acquisitions "
                "WHERE region = %s AND state <> ALL(%s) GROUP BY state",
                (r, _TERMINAL),
            ).fetchall()
        )
        for state in {*_OPEN_STATES, *open_rows}:
            ACQ_OPEN.labels(r, state).set(open_rows.get(state, 0))
        row = conn.execute(
            "SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0), now() "
            "FROM acquisitions WHERE region = %s AND state <> ALL(%s)",
            (r, _TERMINAL),
        ).fetchone()
        assert row is not None
        ACQ_OLDEST.labels(r).set(float(row[0]))
        since, now = self._marks.finished_since, row[1]
        if since is not None:
            for state, seconds in conn.execute(
                "SELECT state, extract(epoch FROM updated_at - created_at) FROM acquisitions "
                "WHERE region = %s AND state = ANY(%s) AND updated_at > %s AND updated_at <= %s",
                (r, _TERMINAL, since, now),
            ).fetchall():
                ACQ_DURATION.labels(r, state).observe(float(seconds))
        self._marks.finished_since = now

    def _latencies(self, conn: psycopg.Connection[Any]) -> None:
        topic = lifecycle_topic(self._region)
        if self._marks.outbox_id is None:
            row = conn.execute("SELECT coalesce(max(id), 0) FROM outbox").fetchone()
            self._marks.outbox_id = int(row[0]) if row else 0
            return
        noticed = self._marks.noticed
        for row_id, instance_id, kind, at, since_create in conn.execute(
            _EVENTS, (topic, self._marks.outbox_id)
        ).fetchall():
            self._marks.outbox_id = row_id
            if kind == "ready" and since_create is not None:
                CREATE_TO_ACTIVE.labels(self._region).observe(max(float(since_create), 0.0))
            elif kind == "notice":
                noticed.setdefault(instance_id, at)
                if len(noticed) > _NOTICED_MAX:
                    del noticed[next(iter(noticed))]
            elif kind == "delete" and (since := noticed.pop(instance_id, None)) is not None:
                seconds = (at - since).total_seconds()
                NOTICE_TO_DELETE.labels(self._region).observe(max(seconds, 0.0))
