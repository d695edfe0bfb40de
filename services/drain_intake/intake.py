"""Drain reports from NATS into the ledger's lost-work table, continuously.

Node agents publish each `drain_finished` report on `sco.<region>.drain.<hall>.<node>`
(agent/report.py), a plain publish that never waits on the control plane. The region's
drain stream (JetStream, on disk, kept a week) holds them whoever is listening; one
durable pull consumer books them: a report is acknowledged only once its rows are in the
ledger, so a report outlives a ledger outage, a restart of this process and a restart
of NATS, and is booked once however often it is delivered (rows are keyed by node, notice
and workload: activities.ledger.lost_work). The agent's other reports on the same subject
(notice received, notice refused) are acknowledged unbooked.

Every message crosses a trust boundary: a node (or a workload on it) wrote it. So:
- who sent it is the subject, which the NATS server authorised for that node's user only
  (workers/nats_permissions.py); the node, hall and region are read from there, and a body
  naming another node is refused;
- the stream refuses messages over `MAX_REPORT_BYTES` and keeps at most
  `MAX_MSGS_PER_NODE` per node (a flooding node only pushes out its own);
- each message is bounded (size, depth) before it is parsed and validated after (types,
  counts, times); nothing in it can raise anything but a refusal;
- a refused message is parked as a dead letter in fleet state with the reason
  (`sco outbox dead-letters`, source `drain`), at most `DEAD_LETTERS_PER_NODE` per node
  per hour (the rest only counted and logged), then acknowledged: it would be refused again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import psycopg
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError
from prometheus_client import Counter

from activities.fleet import dead_letters
from activities.ledger.holder import book_drain_with_holder
from activities.ledger.lost_work import (
    MAX_REPORT_BYTES,
    DrainEventError,
    insert_drain,
    parse_event,
)
from activities.ledger.store import LedgerStore, LedgerUnavailable

log = logging.getLogger(__name__)

DURABLE = "sco-ledger-drains"
KEEP_SECONDS = 7 * 86400  # as long as `sco ledger lost-work`'s default window
# A report whose booking failed (ledger down) comes back after this long.
_REDELIVER_SECONDS = 10.0
#: Per node (subject) the stream keeps this many messages; more push out that node's oldest.
MAX_MSGS_PER_NODE = 1000
MAX_STREAM_BYTES = 1024**3
#: Dead letters parked per node per hour; past it a node's refusals are counted only.
DEAD_LETTERS_PER_NODE = 100
_DEAD_LETTER_WINDOW_SECONDS = 3600.0
#: What a dead letter keeps of a message (an oversized one is cut here).
_DEAD_LETTER_BYTES = 8192

REFUSED = Counter(
    "sco_drain_reports_refused",
    "Drain-subject messages refused (dead-lettered or, past the node's budget, counted)",
    ["region", "reason"],
)


def drain_stream(region: str) -> str:
    return f"SCO_DRAINS_{region.upper().replace('-', '_')}"


def drain_subjects(region: str) -> str:
    return f"sco.{region}.drain.>"


def drain_stream_config(region: str) -> StreamConfig:
    return StreamConfig(
        name=drain_stream(region),
        subjects=[drain_subjects(region)],
        storage=StorageType.FILE,
        max_age=KEEP_SECONDS,
        max_msg_size=MAX_REPORT_BYTES,
        max_msgs_per_subject=MAX_MSGS_PER_NODE,
        max_bytes=MAX_STREAM_BYTES,
        discard=DiscardPolicy.OLD,
    )


@dataclass(frozen=True)
class Sender:
    """Who sent a message: the subject's tokens, which only that node's user may publish."""

    region: str
    hall: str
    node: str


def sender_of(subject: str, region: str) -> Sender:
    parts = subject.split(".")
    if len(parts) != 5 or parts[:3] != ["sco", region, "drain"] or not all(parts):
        raise DrainEventError(f"subject {subject[:120]!r} is not sco.{region}.drain.<hall>.<node>")
    return Sender(region, parts[3], parts[4])


@dataclass
class _Budget:
    """Dead letters per node per window (a flooding node cannot fill fleet state)."""

    limit: int
    window: float
    used: dict[str, tuple[float, int]] = field(default_factory=dict)

    def take(self, node: str, now: float) -> bool:
        start, n = self.used.get(node, (now, 0))
        if now - start >= self.window:
            start, n = now, 0
        self.used[node] = (start, n + 1)
        return n < self.limit


@dataclass
class IntakeProgress:
    booked_reports: int = 0
    booked_rows: int = 0
    skipped: int = 0  # reports other than drain_finished
    malformed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    refused_uncounted: int = 0  # refused past the node's dead-letter budget


class DrainIntake:
    """Books one region's drain reports; `step()` handles one batch."""

    def __init__(
        self,
        js: JetStreamContext,
        store_factory: Callable[[], LedgerStore],
        region: str,
        *,
        batch: int = 64,
        fetch_seconds: float = 1.0,
        dead_letter_dsn: str | None = None,
        dead_letters_per_node: int = DEAD_LETTERS_PER_NODE,
    ) -> None:
        self._js = js
        self._store_factory = store_factory
        self._store: LedgerStore | None = None
        self.region = region
        self._batch = batch
        self._fetch_seconds = fetch_seconds
        self._sub: JetStreamContext.PullSubscription | None = None
        self._dead_letter_dsn = dead_letter_dsn
        self._budget = _Budget(dead_letters_per_node, _DEAD_LETTER_WINDOW_SECONDS)
        self.progress = IntakeProgress()

    async def ensure(self) -> None:
        """The stream and the durable consumer (both idempotent)."""
        name = drain_stream(self.region)
        wanted = drain_stream_config(self.region)
        try:
            info = await self._js.stream_info(name)
        except NotFoundError:
            await self._js.add_stream(wanted)
        else:  # a stream made before the limits: given them
            have = info.config
            if (have.max_msg_size, have.max_msgs_per_subject, have.max_bytes) != (
                wanted.max_msg_size,
                wanted.max_msgs_per_subject,
                wanted.max_bytes,
            ):
                have.max_msg_size = wanted.max_msg_size
                have.max_msgs_per_subject = wanted.max_msgs_per_subject
                have.max_bytes = wanted.max_bytes
                have.discard = wanted.discard
                await self._js.update_stream(have)
        self._sub = await self._js.pull_subscribe(
            drain_subjects(self.region),
            durable=DURABLE,
            stream=name,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=60, max_deliver=-1),
        )

    async def reset(self) -> None:
        """After a NATS failure: the next step binds to the stream and consumer again
        (re-creating them if the server lost them)."""
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):  # the old subscription may be dead already
                await sub.unsubscribe()

    async def step(self) -> int:
        """Fetch and book one batch; the number of messages handled (0: none waiting)."""
        if self._sub is None:
            await self.ensure()
        assert self._sub is not None
        try:
            msgs = await self._sub.fetch(self._batch, timeout=self._fetch_seconds)
        except nats.errors.TimeoutError:
            return 0
        for msg in msgs:
            await self._handle(msg)
        return len(msgs)

    async def _handle(self, msg: Msg) -> None:
        try:
            sender = sender_of(msg.subject, self.region)
            event = parse_event(msg.data)
            if event.get("event") != "drain_finished":
                # The agent's other reports (notice received, refused) share the
                # subject; they are the journal's, not the ledger's.
                self.progress.skipped += 1
                await msg.ack()
                return
            rows = await asyncio.to_thread(self._book, event, sender)
        except DrainEventError as exc:
            await self._refuse(msg, str(exc), exc.kind)
            return
        except LedgerUnavailable as exc:
            self.progress.retried += 1
            log.warning("ledger unavailable, drain report kept for later: %s", exc)
            await msg.nak(delay=_REDELIVER_SECONDS)
            return
        except Exception as exc:  # the ledger refused the rows: they would fail again
            reason = f"ledger refused it: {type(exc).__name__}: {str(exc)[:300]}"
            await self._refuse(msg, reason, "ledger")
            return
        self.progress.booked_reports += 1
        self.progress.booked_rows += rows
        await msg.ack()

    async def _refuse(self, msg: Msg, reason: str, kind: str) -> None:
        """Park `msg` with `reason` (within its node's budget), then acknowledge it; while
        fleet state is away it comes back later instead."""
        node = msg.subject.rsplit(".", 1)[-1][:128]
        if self._dead_letter_dsn is None or not self._budget.take(node, time.monotonic()):
            self.progress.malformed += 1
            self.progress.refused_uncounted += self._dead_letter_dsn is not None
            REFUSED.labels(self.region, kind).inc()
            log.error("drain report on %s refused, dropped: %s", msg.subject[:200], reason)
            await msg.ack()
            return
        try:
            await asyncio.to_thread(self._park, msg, reason)
        except psycopg.Error as exc:
            log.warning("cannot park a refused drain report (%s); kept for later", exc)
            await msg.nak(delay=_REDELIVER_SECONDS)
            return
        self.progress.malformed += 1
        self.progress.dead_lettered += 1
        REFUSED.labels(self.region, kind).inc()
        log.error("drain report on %s refused, dead-lettered: %s", msg.subject[:200], reason)
        await msg.ack()

    def _park(self, msg: Msg, reason: str) -> None:
        assert self._dead_letter_dsn is not None
        meta: Any = None
        with contextlib.suppress(Exception):  # not a JetStream message: no sequence
            meta = msg.metadata
        where = f"{drain_stream(self.region)}@{meta.sequence.stream}" if meta else ""
        with psycopg.connect(self._dead_letter_dsn, connect_timeout=5) as conn:
            dead_letters.record(
                conn,
                source="drain",
                topic=msg.subject[:256],
                key=msg.subject.rsplit(".", 1)[-1][:128],
                value=bytes(msg.data[:_DEAD_LETTER_BYTES]),
                reason=f"refused: {reason}"
                + (
                    f" (first {_DEAD_LETTER_BYTES} bytes kept)"
                    if len(msg.data) > _DEAD_LETTER_BYTES
                    else ""
                ),
                location=where,
            )

    def _book(self, event: dict[str, Any], sender: Sender) -> int:
        if self._store is None:
            self._store = self._store_factory()
        # An embedded ledger's holder (the consumer) books it without handing the ledger
        # over, and this process never loads the engine (decision 0043).
        booked = book_drain_with_holder(self._store, event, sender.region, node=sender.node)
        if booked is not None:
            return booked
        return insert_drain(self._store, event, sender.region, node=sender.node)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
