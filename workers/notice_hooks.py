"""Telling Temporal about reclaim notices, from the region worker (decision 0030).

The notice relays publish every notice on the region's JetStream stream for the nodes;
the region worker reads the same stream through one durable consumer shared by all its
workers and, per notice, signals the pool's exclusion cycle (a hard notice) or wakes the
controllers (an early warning: its replacement starts now, not at the next tick). A
notice is acknowledged once Temporal took the signal; while Temporal is away it is
redelivered with capped backoff, and it waits in the stream while no worker runs (kept
one day, far past any deadline). The relays therefore never load temporalio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from temporalio.client import Client

from activities.backoff import CappedBackoff
from contracts.bounded import MAX_NOTICE_BYTES, InputRejected, loads
from contracts.notice import (
    NOTICE_HOOKS_CONSUMER,
    NoticeStage,
    ReclaimNotice,
    notice_stream,
    region_notice_subjects,
)
from workers.controller_wake import wake_controllers
from workers.nats_connect import connect_until_up
from workers.settings import Settings
from workflows.exclusion.client import notify_reclaim

log = logging.getLogger(__name__)


@dataclass
class HookCounts:
    told: int = 0
    failed_attempts: int = 0
    dropped: int = 0


def notice_of(data: bytes) -> ReclaimNotice:
    """The notice inside a relay's signed envelope (the stream is the control plane's
    own: the signature is for the nodes). ValueError: not a notice."""
    try:  # bounded first: size and depth, as every parse of what arrives on NATS
        body = loads(data, what="notice", max_bytes=MAX_NOTICE_BYTES)["notice"]
    except (InputRejected, KeyError, TypeError) as exc:
        raise ValueError(f"not a signed notice: {exc}") from exc
    return ReclaimNotice.from_json(body)


class NoticeHookConsumer:
    """The region's notices, told to Temporal; `run` until `stop` is set."""

    def __init__(
        self,
        client: Client,
        region: str,
        task_queue: str,
        partitions: int,
        *,
        call_timeout: float = 5.0,
        backoff: CappedBackoff | None = None,
        fetch_seconds: float = 5.0,
    ) -> None:
        self._client = client  # swapped after a certificate renewal (temporal_reconnect)
        self._region, self._task_queue, self._partitions = region, task_queue, partitions
        self._call_timeout = call_timeout
        self._backoff = backoff or CappedBackoff(initial=1.0, cap=30.0)
        self._fetch_seconds = fetch_seconds
        self.counts = HookCounts()

    async def run(self, js: JetStreamContext, stop: asyncio.Event) -> None:
        while not stop.is_set():
            sub = await self._subscribe(js, stop)
            if sub is None:
                return
            try:
                await self._serve(sub, stop)
            finally:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()

    async def _serve(self, sub: JetStreamContext.PullSubscription, stop: asyncio.Event) -> None:
        """Fetch and tell until stopped or a fetch fails: NATS away (it reconnects by
        itself), or the consumer or its stream gone; `run` then subscribes again, which
        makes the consumer again where it is gone."""
        while not stop.is_set():
            try:
                msgs = await sub.fetch(batch=16, timeout=self._fetch_seconds)
            except (nats.errors.TimeoutError, TimeoutError):
                continue  # nothing new
            except nats.errors.Error as exc:
                log.warning("notice hooks: fetch failed (%r), subscribing again", exc)
                await _sleep_unless(stop, self._backoff.next())
                return
            for msg in msgs:
                try:
                    await self._handle(msg)
                except nats.errors.Error as exc:  # the answer lost: handed out again later
                    log.warning("notice hooks: %s not acknowledged (%s)", msg.subject, exc)

    async def _subscribe(
        self, js: JetStreamContext, stop: asyncio.Event
    ) -> JetStreamContext.PullSubscription | None:
        """The durable consumer, once the stream is there (the relays make it); None when
        stopped first. A new consumer starts at the stream's oldest notice: one published
        before any worker ran is told too (signals are idempotent per instance, and the
        exclusion cycle counts a notice by its own time)."""
        backoff = CappedBackoff(initial=0.5, cap=10.0)
        while not stop.is_set():
            try:
                return await js.pull_subscribe(
                    region_notice_subjects(self._region),
                    durable=NOTICE_HOOKS_CONSUMER,
                    stream=notice_stream(self._region),
                    config=ConsumerConfig(
                        ack_policy=AckPolicy.EXPLICIT,
                        deliver_policy=DeliverPolicy.ALL,
                        ack_wait=max(30.0, 4 * self._call_timeout),
                    ),
                )
            except (NotFoundError, nats.errors.Error, OSError) as exc:
                # Said once: a region whose relays have not started yet waits quietly.
                (log.debug if backoff.failures else log.info)(
                    "notice hooks: stream %s not there yet (%s); waiting for it",
                    notice_stream(self._region),
                    exc,
                )
                await _sleep_unless(stop, backoff.next())
        return None

    async def _handle(self, msg: Msg) -> None:
        try:
            notice = notice_of(msg.data)
            await asyncio.wait_for(self._tell(notice), self._call_timeout)
        except ValueError as exc:  # not a notice, or a pool of another region: never
            log.error("notice hook dropped (%s): %s", msg.subject, exc)
            await msg.term()
            self.counts.dropped += 1
            return
        except Exception as exc:  # Temporal away or slow: whatever it raises, again later
            self.counts.failed_attempts += 1
            wait = self._backoff.next()
            if self._backoff.failures == 1:
                log.warning("notice hook for %s not told yet, retrying: %s", msg.subject, exc)
            await msg.nak(delay=wait)
            return
        self._backoff.reset()
        await msg.ack()
        self.counts.told += 1

    async def _tell(self, notice: ReclaimNotice) -> None:
        if notice.stage == NoticeStage.EARLY:
            await wake_controllers(self._client, self._region, self._partitions, notice)
        else:
            await notify_reclaim(
                self._client,
                self._region,
                self._task_queue,
                notice.pool_id,
                notice.node,
                notice.issued_at,
            )


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def tell_notices(settings: Settings, hooks: NoticeHookConsumer, stop: asyncio.Event) -> None:
    """The region worker's side: NATS (retried until up), then `hooks` until `stop`."""
    nc = await connect_until_up(
        settings, stop, max_backoff_seconds=settings.notice_relay.max_backoff_seconds
    )
    if nc is None:
        return
    try:
        await hooks.run(nc.jetstream(), stop)
    finally:
        await nc.close()
