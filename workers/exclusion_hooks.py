"""Telling pools' exclusion cycles about reclaim notices, apart from the notice path.

A notice must reach its node within seconds whatever the control plane does, so the relay
only queues each notice here (no wait); one background task signals the pool's exclusion
workflow, each call bounded, retrying with capped backoff while Temporal is away. What is
still queued when the relay stops, or past the queue's bound, is dropped with a log line:
the exclusion cycle's own periodic count of reclaims catches up with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from activities.backoff import CappedBackoff
from contracts.notice import ReclaimNotice

if TYPE_CHECKING:
    from temporalio.client import Client

log = logging.getLogger(__name__)


@dataclass
class HookCounts:
    told: int = 0
    failed_attempts: int = 0
    dropped: int = 0


class ExclusionHookQueue:
    def __init__(
        self,
        connect: Callable[[], Awaitable[Client]],
        region: str,
        task_queue: str,
        *,
        call_timeout: float = 5.0,
        max_queued: int = 10_000,
        backoff: CappedBackoff | None = None,
        tell: Callable[[Client, ReclaimNotice], Awaitable[None]] | None = None,
        name: str = "exclusion hooks",
    ) -> None:
        """`tell`: what one notice makes of the client (default: signal the pool's
        exclusion cycle); the same queue wakes the controllers on early warnings."""
        self._connect = connect
        self._region, self._task_queue = region, task_queue
        self._call_timeout = call_timeout
        self._queue: asyncio.Queue[ReclaimNotice] = asyncio.Queue(maxsize=max_queued)
        self._backoff = backoff or CappedBackoff(initial=1.0, cap=30.0)
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._in_flight = False
        self._tell_one = tell
        self._name = name
        self.counts = HookCounts()

    @property
    def pending(self) -> int:
        """Notices not told yet, the one being retried included."""
        return self._queue.qsize() + int(self._in_flight)

    async def submit(self, notice: ReclaimNotice) -> None:
        """Queue `notice`; never waits (the relay's `on_notice`)."""
        if self._queue.full():
            self._queue.get_nowait()  # the oldest goes: the cycle's own count covers it
            self.counts.dropped += 1
            log.warning("exclusion hook queue full: dropped the oldest notice")
        self._queue.put_nowait(notice)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._name.replace(" ", "-"))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.pending:
            self.counts.dropped += self.pending
            log.info("%s: %d not told at stop (caught up later)", self._name, self.pending)

    async def _run(self) -> None:
        while True:
            notice = await self._queue.get()
            self._in_flight = True
            for attempt in itertools.count():
                if attempt:
                    await asyncio.sleep(self._backoff.next())
                if await self._tell(notice):
                    break
            self._in_flight = False
            self._backoff.reset()

    def forget_client(self) -> None:
        """The next notice connects a new Temporal client (a renewed certificate: the SDK
        fixes TLS at connect); the old one finishes what it has in hand."""
        self._client = None

    async def _tell(self, notice: ReclaimNotice) -> bool:
        """True when told (or when it can never be told); False to retry."""
        try:
            if self._client is None:
                self._client = await asyncio.wait_for(self._connect(), self._call_timeout)
            if self._tell_one is not None:
                call = self._tell_one(self._client, notice)
            else:
                # Loaded with the first notice, as Temporal's client is: a hall without
                # reclaims keeps its relay free of temporalio (~30 MB).
                from workflows.exclusion.client import notify_reclaim

                call = notify_reclaim(
                    self._client,
                    self._region,
                    self._task_queue,
                    notice.pool_id,
                    notice.node,
                    notice.issued_at,
                )
            await asyncio.wait_for(call, self._call_timeout)
        except ValueError as exc:  # a pool of another region: retrying cannot help
            log.error("exclusion hook for %s dropped: %s", notice.node, exc)
            self.counts.dropped += 1
            return True
        except Exception as exc:  # Temporal away or slow: whatever it raises, retry later
            self.counts.failed_attempts += 1
            if self._backoff.failures == 0:
                log.warning(
                    "exclusion cycle of %s not told yet (%d queued), retrying: %s",
                    notice.pool_id,
                    self.pending,
                    exc or type(exc).__name__,
                )
            return False
        self.counts.told += 1
        return True
