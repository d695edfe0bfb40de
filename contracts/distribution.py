"""The distributor: signed bundles in a NATS JetStream object store, one bucket per region.

Publishing puts `bundle.json` in bucket `sco-contracts-<region>`; nodes fetch it from
there, and `serial-reset.json` when an operator published a serial reset
(contracts/serial_reset.py). The store is only a carrier: nodes verify every bundle
themselves (size first: an object larger than a bundle may be is not even downloaded), so a
bad object in the bucket costs a refresh, never a drain.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import nats
from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectNotFoundError

from contracts.bounded import MAX_BUNDLE_BYTES
from contracts.holders import ensure_bucket
from contracts.serial_reset import MAX_RESET_BYTES
from contracts.serial_reset import OBJECT_NAME as RESET_OBJECT_NAME

OBJECT_NAME = "bundle.json"


def bucket_for(region: str) -> str:
    return f"sco-contracts-{region}"


@dataclass(frozen=True)
class Published:
    bucket: str
    name: str
    size: int
    digest: str


async def publish(
    nats_url: str,
    region: str,
    raw: bytes,
    connect_options: dict[str, Any] | None = None,
    *,
    name: str = OBJECT_NAME,
) -> Published:
    """`connect_options`: extra `nats.connect` arguments (TLS). `name`: the object
    (`bundle.json`, or `serial-reset.json` for a serial reset)."""
    nc = await nats.connect(
        nats_url, connect_timeout=5, max_reconnect_attempts=1, **(connect_options or {})
    )
    try:
        js = nc.jetstream()
        bucket = bucket_for(region)
        try:
            store = await js.object_store(bucket)
        except BucketNotFoundError:
            store = await js.create_object_store(bucket, description="SCO contract bundles")
        info = await store.put(name, raw)
        # Where consumers report the serial they hold (agents cannot make the bucket).
        await ensure_bucket(js, region)
        return Published(bucket, name, info.size or len(raw), info.digest or "")
    finally:
        await nc.close()


log = logging.getLogger(__name__)

#: Longest a node waits for one bundle download before trying again at the next refresh.
FETCH_TIMEOUT_SECONDS = 10.0


class NatsBundleSource:
    """Fetches the region's current bundle; None when none was published yet."""

    def __init__(
        self, nats_url: str, region: str, connect_options: dict[str, Any] | None = None
    ) -> None:
        self._url = nats_url
        self._bucket = bucket_for(region)
        # Credentials, TLS and inbox prefix: the node's own NATS identity.
        self._options = connect_options or {}

    async def fetch(self) -> bytes | None:
        return await self._fetch(OBJECT_NAME, MAX_BUNDLE_BYTES)

    async def fetch_reset(self) -> bytes | None:
        """The region's serial reset, None when none was published."""
        return await self._fetch(RESET_OBJECT_NAME, MAX_RESET_BYTES)

    async def _fetch(self, name: str, max_bytes: int) -> bytes | None:
        nc = await nats.connect(
            self._url,
            connect_timeout=5,
            max_reconnect_attempts=1,
            allow_reconnect=False,
            **self._options,
        )
        try:
            store = await nc.jetstream().object_store(self._bucket)
            # Never download more than the verifier would look at: the size the object's
            # info announces is checked first, and a too-big object is refused unread.
            info = await asyncio.wait_for(store.get_info(name), FETCH_TIMEOUT_SECONDS)
            if (info.size or 0) > max_bytes:
                log.error(
                    "%s/%s is %s bytes, more than %s: not fetched",
                    self._bucket,
                    name,
                    info.size,
                    max_bytes,
                )
                return None
            # A get that races a publish (the old chunks purged under it) waits for chunks
            # that never come: bounded, and the next refresh tries again.
            result = await asyncio.wait_for(store.get(name), FETCH_TIMEOUT_SECONDS)
            return bytes(result.data) if result.data is not None else None
        except (BucketNotFoundError, ObjectNotFoundError, NotFoundError):
            return None
        except TimeoutError:
            log.warning(
                "bundle fetch from %s timed out; trying again at the next refresh", self._bucket
            )
            return None
        finally:
            await nc.close()
