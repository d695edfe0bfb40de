"""The notice relay process of one hall (`sco notice-relay`): answers reclaim requests,
turns the provider's reclaim decisions into notices, and deletes what outlives its
deadline, until SIGTERM/SIGINT. The relay's logic is `activities/notice_relay.py`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta

import nats
from nacl.signing import SigningKey
from nats.aio.msg import Msg
from temporalio.client import Client

from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository
from activities.notice_relay import NoticeRelay
from contracts.notice import ReclaimNotice, ReclaimRequest, reclaim_subject
from contracts.region import Region
from workers.client_security import nats_options, postgres_conninfo
from workers.provider_factory import open_provider
from workers.settings import Settings
from workers.shutdown import async_stop_event

log = logging.getLogger(__name__)


async def run(
    settings: Settings,
    region: Region,
    hall: str,
    signing_key: SigningKey,
    *,
    sweep_seconds: float = 1.0,
) -> None:
    """Relay `hall`'s notices until stopped; NATS, the fleet-state pool and the provider
    are closed after, whatever ends the loop."""
    with async_stop_event() as stop:
        async with contextlib.AsyncExitStack() as opened:
            nc = await nats.connect(settings.nats_url, **nats_options(settings))
            opened.push_async_callback(nc.close)
            pool = open_pool(postgres_conninfo(settings), max_size=2)
            opened.callback(pool.close)
            relay = NoticeRelay(
                region=region.id,
                hall=hall,
                lead=timedelta(seconds=region.notice_lead_seconds),
                repo=FleetRepository(pool),
                provider=await opened.enter_async_context(open_provider(settings, region.id)),
                js=nc.jetstream(),
                signing_key=signing_key,
                on_notice=_exclusion_notifier(settings, region.id),
            )
            await relay.ensure_stream()
            log.info("notice relay %s/%s: republished %d", region.id, hall, await relay.recover())
            await nc.subscribe(reclaim_subject(region.id, hall), cb=_request_handler(relay))
            while not stop.is_set():
                for notice in await relay.poll_provider():
                    log.info("noticed %s (deadline %s)", notice.node, f"{notice.deadline:%H:%M:%S}")
                for iid in await relay.sweep():
                    log.info("deadline passed: deleted %s", iid)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), sweep_seconds)
            # A request being answered finishes before the pool under it closes.
            with contextlib.suppress(nats.errors.ConnectionClosedError):
                await nc.drain()
    log.info("notice relay %s/%s stopped", region.id, hall)


def _request_handler(relay: NoticeRelay) -> Callable[[Msg], Awaitable[None]]:
    """Answers `sco reclaim`: how many instances were noticed, or why none could be."""

    async def answer(msg: Msg) -> None:
        try:
            notices = await relay.handle_request(ReclaimRequest.model_validate_json(msg.data))
            reply = f"{len(notices)} noticed: {', '.join(n.node for n in notices)}"
        except ValueError as exc:
            reply = f"error: {exc}"
        if msg.reply:
            await msg.respond(reply.encode())

    return answer


def _exclusion_notifier(s: Settings, region: str) -> Callable[[ReclaimNotice], Awaitable[None]]:
    """Tell the pool's exclusion cycle about each notice (signal-with-start). Temporal
    being down costs nothing here: the cycle's own periodic count catches up."""
    from workers.temporal_connect import connect
    from workflows.exclusion.client import notify_reclaim

    client: Client | None = None

    async def notify(notice: ReclaimNotice) -> None:
        nonlocal client
        if client is None:
            client = await connect(s, region)
        await notify_reclaim(
            client,
            region,
            s.temporal.task_queue(region),
            notice.pool_id,
            notice.node,
            notice.issued_at,
        )

    return notify
