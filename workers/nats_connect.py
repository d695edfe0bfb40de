"""NATS for a long-running process that must outlive it: connect, retried with capped
backoff until the server answers or the process is told to stop. Once connected the
client reconnects by itself, without limit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NATS

from activities.backoff import CappedBackoff
from contracts.redact import mask_credentials
from workers.client_security import nats_options
from workers.settings import Settings

log = logging.getLogger(__name__)


async def connect_until_up(
    settings: Settings, stop: asyncio.Event, *, max_backoff_seconds: float, **options: Any
) -> NATS | None:
    """NATS, retried until it answers (None when `stop` was set first). `options` go to
    `nats.connect` (a connection name, say)."""
    backoff = CappedBackoff(initial=0.5, cap=max_backoff_seconds)
    while not stop.is_set():
        try:
            return await nats.connect(
                settings.nats_url,
                max_reconnect_attempts=-1,
                allow_reconnect=True,
                **options,
                **nats_options(settings),
            )
        except (nats.errors.Error, OSError) as exc:
            wait = backoff.next()
            log.warning(
                "NATS at %s unavailable (%s); retrying in %.1f s",
                mask_credentials(settings.nats_url),
                exc,
                wait,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
    return None
