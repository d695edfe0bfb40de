"""Fixtures the agent tests share."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client

from contracts.notice import notice_stream
from tests.support.worker_nats import NATS_URL


@pytest.fixture
async def nats_region() -> AsyncIterator[tuple[Client, str]]:
    """A client and a region of our own on the machine's NATS (its notice stream created,
    deleted after); a clear skip where no NATS answers."""
    try:
        nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
    except Exception as exc:
        pytest.skip(f"no NATS at {NATS_URL}: {exc}")
    region = f"t{uuid.uuid4().hex[:8]}"
    js = nc.jetstream()
    await js.add_stream(name=notice_stream(region), subjects=[f"sco.{region}.notice.>"])
    yield nc, region
    await js.delete_stream(notice_stream(region))
    await nc.close()
