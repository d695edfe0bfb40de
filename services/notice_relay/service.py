"""The notice relay process of one hall (`sco notice-relay`): answers reclaim requests,
turns the provider's reclaim decisions into notices, and deletes what outlives its
deadline, until SIGTERM/SIGINT. The relay's logic is `services/notice_relay/relay.py`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta

import nats
import psycopg
from nacl.signing import SigningKey
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from prometheus_client import Counter, Gauge

from activities.backoff import CappedBackoff
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository
from contracts.notice import (
    NOTICE_HOOKS_CONSUMER,
    notice_stream,
    reclaim_subject,
)
from contracts.reclaim import ReclaimReply, ReclaimRequest
from contracts.region import Region
from services.notice_relay.keyfile import KeyFileSigner
from services.notice_relay.relay import (
    DEADLINE_DELETES,
    NOTICES_PUBLISHED,
    PUBLISH_SLACK,
    NoticeRelay,
)
from workers import cert_renewal
from workers.client_security import postgres_conninfo
from workers.endpoints import serve_health, start_metrics
from workers.nats_connect import connect_until_up
from workers.provider_factory import open_provider
from workers.settings import Settings
from workers.shutdown import async_stop_event

log = logging.getLogger(__name__)


DEGRADED = Gauge(
    "sco_notice_relay_degraded",
    "1 while the hall's notice relay cannot reach a dependency (and retries), else 0",
    ["region", "hall"],
)
ERRORS = Counter(
    "sco_notice_relay_errors",
    "Failed relay steps (a dependency away), by the exception's type",
    ["region", "hall", "error"],
)

# The faults the loop outlives: fleet state (PostgreSQL, the pool's PoolTimeout included),
# NATS/JetStream, and the network under either.
_DEPENDENCY_ERRORS = (psycopg.Error, nats.errors.Error, OSError, TimeoutError)


async def run(
    settings: Settings,
    region: Region,
    hall: str,
    signing_key: SigningKey | KeyFileSigner,
    *,
    sweep_seconds: float = 1.0,
) -> None:
    """Relay `hall`'s notices until stopped; NATS, the fleet-state pool and the provider
    are closed after, whatever ends the loop.

    No dependency's outage ends it: a failed step is retried with capped backoff
    (`notice_relay.max_backoff_seconds`), and after any failure the hall's pending
    notices are republished (same ids, so nodes act once) before the loop goes on."""
    with async_stop_event() as stop, _reload_on_hangup(signing_key):
        async with contextlib.AsyncExitStack() as opened:
            nc = await _connect_nats(settings, stop)
            if nc is None:
                return
            opened.push_async_callback(nc.close)
            pool = open_pool(
                postgres_conninfo(settings),
                max_size=2,
                wait=False,
                timeouts=settings.fleet_db.timeouts(),
                max_lifetime=cert_renewal.pool_max_lifetime(settings),
            )
            opened.callback(pool.close)
            relay = NoticeRelay(
                region=region.id,
                hall=hall,
                lead=timedelta(seconds=region.notice_lead_seconds),
                repo=FleetRepository(pool),
                provider=await opened.enter_async_context(open_provider(settings, region.id)),
                js=nc.jetstream(),
                signing_key=signing_key,
            )
            await nc.subscribe(
                reclaim_subject(region.id, hall),
                cb=request_handler(relay, hooks_pending(nc.jetstream(), region.id)),
            )
            if isinstance(signing_key, KeyFileSigner):
                log.info(
                    "notice relay %s/%s signs with key %s from %s (re-read on change or SIGHUP)",
                    region.id,
                    hall,
                    signing_key.key_id,
                    signing_key.path,
                )
            backoff = CappedBackoff(initial=0.5, cap=settings.notice_relay.max_backoff_seconds)
            stream_ready = recovered = False
            degraded = DEGRADED.labels(region=region.id, hall=hall)
            for family in (NOTICES_PUBLISHED, DEADLINE_DELETES, PUBLISH_SLACK):
                family.labels(region.id, hall)  # every series from the start, at zero
            start_metrics(
                settings.notice_relay.metrics_port, setting="SCO_NOTICE_RELAY__METRICS_PORT"
            )
            if settings.notice_relay.health_port:
                health = await serve_health(
                    "0.0.0.0",
                    settings.notice_relay.health_port,
                    lambda: recovered and backoff.failures == 0,
                )
                opened.callback(health.close)
            while not stop.is_set():
                wait = sweep_seconds
                try:
                    if not stream_ready:
                        await relay.ensure_stream()
                        stream_ready = True
                    if not recovered:
                        republished = await relay.recover()
                        recovered = True
                        log.info("notice relay %s/%s: republished %d", region.id, hall, republished)
                    for notice in await relay.poll_provider():
                        log.info(
                            "noticed %s (deadline %s)", notice.node, f"{notice.deadline:%H:%M:%S}"
                        )
                    for notice in await relay.notice_planned():
                        log.info(
                            "planned reclaim due: noticed %s (deadline %s)",
                            notice.node,
                            f"{notice.deadline:%H:%M:%S}",
                        )
                    for iid in await relay.sweep():
                        log.info("deadline passed: deleted %s", iid)
                    if backoff.failures:
                        log.info("notice relay %s/%s: dependencies back", region.id, hall)
                    backoff.reset()
                    degraded.set(0)
                except _DEPENDENCY_ERRORS as exc:
                    # A notice recorded but not published in the outage goes out on recovery.
                    recovered = False
                    degraded.set(1)
                    ERRORS.labels(region.id, hall, type(exc).__name__).inc()
                    wait = backoff.next()
                    log.warning(
                        "notice relay %s/%s degraded (%s: %s); retrying in %.1f s",
                        region.id,
                        hall,
                        type(exc).__name__,
                        exc,
                        wait,
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
            # A request being answered finishes before the pool under it closes.
            with contextlib.suppress(nats.errors.ConnectionClosedError):
                await nc.drain()
    log.info("notice relay %s/%s stopped", region.id, hall)


@contextlib.contextmanager
def _reload_on_hangup(signing_key: SigningKey | KeyFileSigner) -> Iterator[None]:
    """SIGHUP reads the key file again (a change is also noticed before each signature)."""
    if not isinstance(signing_key, KeyFileSigner):
        yield
        return
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, signing_key.reload)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGHUP)


def hooks_pending(js: JetStreamContext, region: str) -> Callable[[], Awaitable[int]]:
    """How many of the region's notices the region worker has still to tell Temporal of:
    its durable consumer's backlog, or, before any worker made it, every notice the stream
    holds (the consumer starts at the oldest); 0 when NATS does not say."""

    async def pending() -> int:
        try:
            try:
                info = await js.consumer_info(notice_stream(region), NOTICE_HOOKS_CONSUMER)
            except NotFoundError:
                return int((await js.stream_info(notice_stream(region))).state.messages)
        except (nats.errors.Error, OSError, TimeoutError):
            return 0
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    return pending


async def _connect_nats(settings: Settings, stop: asyncio.Event) -> NATS | None:
    """NATS, retried until it answers (None when stopped first)."""
    return await connect_until_up(
        settings, stop, max_backoff_seconds=settings.notice_relay.max_backoff_seconds
    )


def request_handler(
    relay: NoticeRelay, hooks_pending: Callable[[], Awaitable[int]]
) -> Callable[[Msg], Awaitable[None]]:
    """Answers `sco reclaim` at once: which instances were noticed, or why none could be.
    The region worker tells the exclusion cycle from the notice stream (never waited on
    here); the answer says how many such notices it has still to tell."""

    async def answer(msg: Msg) -> None:
        try:
            request = ReclaimRequest.model_validate_json(msg.data)
            notices, refused = await relay.answer_request(request)
            early = [n for n in notices if n.early]
            reply = ReclaimReply(
                noticed=[n.node for n in notices if not n.early],
                warned_early=[n.node for n in early],
                reclaim_at=early[0].deadline if early else None,
                lead_seconds=relay.lead.total_seconds(),
                hooks_pending=await hooks_pending(),
                refused_committed=refused,
            )
            if refused and not notices:
                reply = reply.model_copy(
                    update={
                        "error": f"{', '.join(refused)}: committed capacity (a floor's or a "
                        "paid fallback's); refused without --force"
                    }
                )
        except ValueError as exc:
            reply = ReclaimReply(error=str(exc))
        except _DEPENDENCY_ERRORS as exc:
            reply = ReclaimReply(
                error=f"notice relay degraded, nothing noticed: {type(exc).__name__}: {exc}"
            )
        if msg.reply:
            with contextlib.suppress(*_DEPENDENCY_ERRORS):
                await msg.respond(reply.model_dump_json().encode())

    return answer
