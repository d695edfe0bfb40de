"""Drain reports from NATS into the ledger's lost-work table, continuously.

Node agents publish each `drain_finished` report on `sco.<region>.drain.<hall>.<node>`
(agent/report.py), a plain publish that never waits on the control plane. The region's
drain stream (JetStream, on disk, kept a week) holds them whoever is listening; one
durable pull consumer books them: a report is acknowledged only once its rows are in the
ledger, so a report outlives a ledger outage, a restart of this process and a restart
of NATS, and is booked once however often it is delivered (rows are keyed by notice and
workload: activities.ledger.lost_work). A message that is not a drain report is logged,
counted and acknowledged: it would never parse on redelivery either. The agent's other
reports on the same subject (notice received, notice refused) are acknowledged unbooked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from activities.ledger.lost_work import DrainEventError, insert_drain
from activities.ledger.store import LedgerStore, LedgerUnavailable

log = logging.getLogger(__name__)

DURABLE = "sco-ledger-drains"
KEEP_SECONDS = 7 * 86400  # as long as `sco ledger lost-work`'s default window
# A report whose booking failed (ledger down) comes back after this long.
_REDELIVER_SECONDS = 10.0


def drain_stream(region: str) -> str:
    return f"SCO_DRAINS_{region.upper().replace('-', '_')}"


def drain_subjects(region: str) -> str:
    return f"sco.{region}.drain.>"


@dataclass
class IntakeProgress:
    booked_reports: int = 0
    booked_rows: int = 0
    skipped: int = 0  # reports other than drain_finished
    malformed: int = 0
    retried: int = 0


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
    ) -> None:
        self._js = js
        self._store_factory = store_factory
        self._store: LedgerStore | None = None
        self.region = region
        self._batch = batch
        self._fetch_seconds = fetch_seconds
        self._sub: JetStreamContext.PullSubscription | None = None
        self.progress = IntakeProgress()

    async def ensure(self) -> None:
        """The stream and the durable consumer (both idempotent)."""
        name = drain_stream(self.region)
        try:
            await self._js.stream_info(name)
        except NotFoundError:
            await self._js.add_stream(
                StreamConfig(
                    name=name,
                    subjects=[drain_subjects(self.region)],
                    storage=StorageType.FILE,
                    max_age=KEEP_SECONDS,
                )
            )
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
            try:
                event = json.loads(msg.data)
                if not isinstance(event, dict):
                    raise DrainEventError("not a JSON object")
                if event.get("event") != "drain_finished":
                    # The agent's other reports (notice received, refused) share the
                    # subject; they are the journal's, not the ledger's.
                    self.progress.skipped += 1
                    await msg.ack()
                    continue
                rows = await asyncio.to_thread(self._book, event)
            except (ValueError, DrainEventError) as exc:  # JSONDecodeError is a ValueError
                self.progress.malformed += 1
                log.error("drain report on %s not booked, dropped: %s", msg.subject, exc)
                await msg.ack()
                continue
            except LedgerUnavailable as exc:
                self.progress.retried += 1
                log.warning("ledger unavailable, drain report kept for later: %s", exc)
                await msg.nak(delay=_REDELIVER_SECONDS)
                continue
            self.progress.booked_reports += 1
            self.progress.booked_rows += rows
            await msg.ack()
        return len(msgs)

    def _book(self, event: dict[str, object]) -> int:
        if self._store is None:
            self._store = self._store_factory()
        return insert_drain(self._store, event, self.region)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
