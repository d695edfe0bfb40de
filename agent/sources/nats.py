"""Notices from the region's notice relay over NATS JetStream, for this node only.

Subscribes to `sco.<region>.notice.<hall>.<node>` with a durable consumer named for the
node, so notices published while the agent was down are delivered when it comes back
(the stream keeps them; the dedupe store drops what was already drained). When the stream
does not exist yet the source listens on plain NATS and retries JetStream later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from agent.natslink import NatsLink
from agent.notices import SignedMessage, Sink
from contracts.notice import notice_stream, notice_subject

log = logging.getLogger(__name__)


class NatsNoticeSource:
    name = "nats"

    def __init__(
        self, link: NatsLink, region: str, hall: str, node: str, *, retry_seconds: float = 10.0
    ) -> None:
        self._link = link
        self._node = node
        self._subject = notice_subject(region, hall, node)
        self._stream = notice_stream(region)
        self._durable = f"sco-agent-{node}"
        self._retry = retry_seconds
        self._sink: Sink | None = None
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self.watching = asyncio.Event()  # set once the JetStream consumer is in place

    async def start(self, sink: Sink) -> None:
        self._sink = sink
        self._task = asyncio.create_task(self._run(), name="nats-notices")

    async def _run(self) -> None:
        await self._link.connected.wait()
        client = self._link.client
        assert client is not None
        js = client.jetstream()
        while True:
            try:
                sub = await js.subscribe(
                    self._subject,
                    stream=self._stream,
                    durable=self._durable,
                    cb=self._on_message,
                    manual_ack=True,
                    config=ConsumerConfig(
                        # A name makes the create subject carry the filter, which is how
                        # the NATS permissions pin a node's consumer to its own subject.
                        name=self._durable,
                        deliver_policy=DeliverPolicy.ALL,
                        ack_policy=AckPolicy.EXPLICIT,
                        ack_wait=30,
                    ),
                )
                if self._sub is not None:  # the plain-NATS fallback is no longer needed
                    with contextlib.suppress(Exception):
                        await self._sub.unsubscribe()
                self._sub = sub
                self.watching.set()
                log.info("watching %s on stream %s", self._subject, self._stream)
                return
            except Exception as exc:  # no stream yet, or JetStream disabled
                if self._sub is None:
                    self._sub = await client.subscribe(self._subject, cb=self._on_message)
                log.warning(
                    "JetStream stream %s unavailable (%s); listening on plain NATS, retrying",
                    self._stream,
                    exc,
                )
                await asyncio.sleep(self._retry)

    async def _on_message(self, msg: Msg) -> None:
        assert self._sink is not None
        # Verified (or refused and journalled) by the agent; either way the stream need
        # not redeliver it.
        await self._sink(SignedMessage(msg.data, self.name, msg.subject))
        await _ack(msg)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None


async def _ack(msg: Msg) -> None:
    if msg.reply:  # JetStream messages have one; plain NATS messages do not
        with contextlib.suppress(Exception):
            await msg.ack()
