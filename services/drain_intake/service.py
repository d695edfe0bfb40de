"""The drain intake process (`sco ledger book-drains`): node agents' drain reports from
NATS into the ledger's lost-work table, until SIGTERM/SIGINT. The booking logic is
`services/drain_intake/intake.py`.

No outage ends it: NATS is connected with retries (and reconnects by itself after), a
failed step (NATS down or restarted, the stream gone) is retried with capped backoff
after binding to the stream again, and a report the ledger could not take is redelivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import nats
import nats.errors
from nats.aio.client import Client as NATS
from prometheus_client import Counter

from activities.backoff import CappedBackoff
from activities.ledger.store import LedgerStore
from contracts.redact import mask_credentials
from services.drain_intake.intake import DrainIntake, IntakeProgress
from workers.client_security import ledger_options, postgres_conninfo
from workers.endpoints import serve_health, start_metrics
from workers.nats_connect import connect_until_up
from workers.settings import Settings
from workers.shutdown import async_stop_event

log = logging.getLogger(__name__)

_MAX_BACKOFF_SECONDS = 10.0
_FAULTS = (nats.errors.Error, OSError, TimeoutError)

BOOKED = Counter("sco_drain_reports_booked", "Drain reports booked into the ledger", ["region"])
MALFORMED = Counter(
    "sco_drain_reports_malformed",
    "Messages on the drain subjects refused (not a report, out of bounds, forged)",
    ["region"],
)


async def run(
    settings: Settings, regions: Sequence[str], *, stop: asyncio.Event | None = None
) -> dict[str, IntakeProgress]:
    """Book until stopped (`stop`, or SIGTERM/SIGINT); the counts per region."""
    if stop is not None:
        return await _run(settings, regions, stop)
    with async_stop_event() as signalled:
        return await _run(settings, regions, signalled)


async def _run(
    settings: Settings, regions: Sequence[str], stop: asyncio.Event
) -> dict[str, IntakeProgress]:
    start_metrics(settings.drain_intake_metrics_port, setting="SCO_DRAIN_INTAKE_METRICS_PORT")
    healthy = [False]
    health = None
    if settings.drain_intake_health_port:
        health = await serve_health(
            "0.0.0.0", settings.drain_intake_health_port, lambda: healthy[0]
        )
    try:
        return await _book(settings, regions, stop, healthy)
    finally:
        if health is not None:
            health.close()


async def _book(
    settings: Settings, regions: Sequence[str], stop: asyncio.Event, healthy: list[bool]
) -> dict[str, IntakeProgress]:
    nc = await _connect(settings, stop)
    if nc is None:
        return {}

    def store() -> LedgerStore:
        return LedgerStore(settings.effective_ledger_dsn, client_options=ledger_options(settings))

    # Refused reports are parked in fleet state beside the other dead letters.
    dead_letter_dsn = postgres_conninfo(settings)
    intakes = [
        DrainIntake(nc.jetstream(), store, r, dead_letter_dsn=dead_letter_dsn) for r in regions
    ]
    backoff = CappedBackoff(initial=0.5, cap=_MAX_BACKOFF_SECONDS)
    log.info(
        "drain intake: %s → %s",
        ", ".join(regions),
        mask_credentials(settings.effective_ledger_dsn),
    )
    try:
        while not stop.is_set():
            try:
                handled = 0
                for intake in intakes:
                    before = (intake.progress.booked_reports, intake.progress.malformed)
                    handled += await intake.step()
                    BOOKED.labels(intake.region).inc(intake.progress.booked_reports - before[0])
                    MALFORMED.labels(intake.region).inc(intake.progress.malformed - before[1])
                healthy[0] = nc.is_connected
                if backoff.failures:
                    log.info("drain intake: NATS back")
                backoff.reset()
                if handled == 0:  # fetch already waited its second; a breath for stop
                    await asyncio.sleep(0)
            except _FAULTS as exc:
                healthy[0] = False
                wait = backoff.next()
                log.warning(
                    "drain intake degraded (%s: %s); retrying in %.1f s",
                    type(exc).__name__,
                    exc,
                    wait,
                )
                for intake in intakes:
                    await intake.reset()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
    finally:
        for intake in intakes:
            intake.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)
    return {i.region: i.progress for i in intakes}


async def _connect(settings: Settings, stop: asyncio.Event) -> NATS | None:
    """NATS, retried until it answers (None when stopped first)."""
    return await connect_until_up(
        settings,
        stop,
        max_backoff_seconds=_MAX_BACKOFF_SECONDS,
        reconnect_time_wait=1,
        name="sco-drain-intake",
    )
