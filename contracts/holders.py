"""Which bundle each consumer holds: one heartbeat per consumer in the region's NATS.

Every consumer of the region's signed bundle (a control-plane pod's puller, a node's
agent) puts what it holds after each refresh into the JetStream key-value bucket
`sco-contract-holders-<region>`, under `<kind>.<name>`: the serial (or none) and when.
`sco contracts status` reads the bucket beside the published bundle: a consumer on an
older serial, holding none, or silent for longer than a few refreshes is shown as such.

A put is a plain JetStream publish on the key's subject (`$KV.<bucket>.<key>`), so an agent
needs publish permission on its own key only (workers/nats_permissions.py), never the
bucket's API. Reporting never holds up a refresh: failures are logged and dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

import nats
from nats.js.api import KeyValueConfig
from nats.js.errors import (
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    NoStreamResponseError,
)
from nats.js.kv import KeyValue

from contracts.bounded import loads

log = logging.getLogger(__name__)

Kind = Literal["control", "agent"]
#: A consumer that stopped for this long drops out of the bucket (its last entry expires).
HOLDING_TTL = timedelta(days=1)
REPORT_TIMEOUT_SECONDS = 5.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_=-]")


def holders_bucket(region: str) -> str:
    return f"sco-contract-holders-{region}"


def holder_key(kind: Kind, name: str) -> str:
    """The consumer's key: dots and anything a NATS subject token cannot hold become `_`."""
    return f"{kind}.{_UNSAFE.sub('_', name) or '_'}"


def holder_subject(region: str, kind: Kind, name: str) -> str:
    return f"$KV.{holders_bucket(region)}.{holder_key(kind, name)}"


@dataclass(frozen=True)
class Holding:
    kind: Kind
    name: str
    serial: int | None  # None: holds no valid bundle
    reported_at: datetime

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "kind": self.kind,
                "name": self.name,
                "serial": self.serial,
                "reported_at": self.reported_at.isoformat(),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Holding:
        """ValueError (InputRejected for size, depth or number length), KeyError or
        TypeError when `raw` (what a node wrote) is not a holding."""
        doc = loads(raw, what="holding", max_bytes=4096)
        kind = doc["kind"]
        if kind not in ("control", "agent"):
            raise ValueError(f"kind {kind!r} is neither control nor agent")
        serial = doc["serial"]
        return cls(
            kind=kind,
            name=str(doc["name"]),
            serial=None if serial is None else int(serial),
            reported_at=datetime.fromisoformat(doc["reported_at"]),
        )


async def ensure_bucket(js: Any, region: str) -> KeyValue:
    """The region's holders bucket, made when missing (publisher and control plane only)."""
    bucket = holders_bucket(region)
    try:
        kv: KeyValue = await js.key_value(bucket)
    except BucketNotFoundError:
        kv = await js.create_key_value(
            KeyValueConfig(
                bucket=bucket,
                description="SCO: the contract bundle serial each consumer holds",
                history=1,
                ttl=HOLDING_TTL.total_seconds(),
            )
        )
    return kv


class HoldingReporter:
    """Reports one consumer's holding to the first NATS server that answers."""

    def __init__(
        self,
        nats_urls: Sequence[str],
        region: str,
        kind: Kind,
        name: str,
        connect_options: dict[str, Any] | None = None,
        *,
        create_bucket: bool = False,
    ) -> None:
        self._urls = list(nats_urls)
        self._region = region
        self.kind: Kind = kind
        self.name = name
        self._options = connect_options or {}
        # Agents may not create buckets; the control plane and the publisher do.
        self._create = create_bucket

    async def report(self, serial: int | None, now: datetime | None = None) -> bool:
        """True once a server stored it; never raises."""
        holding = Holding(self.kind, self.name, serial, now or datetime.now(UTC))
        subject = holder_subject(self._region, self.kind, self.name)
        for url in self._urls:
            try:
                await asyncio.wait_for(self._put(url, subject, holding), REPORT_TIMEOUT_SECONDS)
                return True
            except Exception as exc:  # nats raises several unrelated types; try the next
                log.warning("reporting bundle serial %s to %s failed: %s", serial, url, exc)
        return False

    async def _put(self, url: str, subject: str, holding: Holding) -> None:
        nc = await nats.connect(
            url, connect_timeout=5, max_reconnect_attempts=1, allow_reconnect=False, **self._options
        )
        try:
            js = nc.jetstream()
            try:
                await js.publish(subject, holding.to_json())
            except NoStreamResponseError:
                if not self._create:
                    raise RuntimeError(f"no bucket {holders_bucket(self._region)} yet") from None
                await ensure_bucket(js, self._region)
                await js.publish(subject, holding.to_json())
        finally:
            await nc.close()


async def read_holdings(
    nats_url: str, region: str, connect_options: dict[str, Any] | None = None
) -> list[Holding]:
    """Every consumer's last report, by key; [] when nobody reported yet.

    The keys come from the bucket's stream (its subjects with a message), not from
    `KeyValue.keys()`: that one watches the bucket and, on a busy machine, can signal "no
    more keys" before the first delivered key is read, and so answer that there are none."""
    nc = await nats.connect(
        nats_url, connect_timeout=5, max_reconnect_attempts=1, **(connect_options or {})
    )
    try:
        js = nc.jetstream()
        bucket = holders_bucket(region)
        try:
            kv = await js.key_value(bucket)
        except BucketNotFoundError:
            return []
        prefix = f"$KV.{bucket}."
        info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"{prefix}>")
        out = []
        for subject in sorted(info.state.subjects or {}):
            key = subject.removeprefix(prefix)
            try:
                entry = await kv.get(key)
            except (KeyNotFoundError, KeyDeletedError):  # deleted or expired since read
                continue
            if entry.value:
                try:
                    out.append(Holding.from_json(entry.value))
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("holders entry %s is not a holding: %s", key, exc)
        return out
    finally:
        await nc.close()


class State(StrEnum):
    CURRENT = "current"
    OLD = "old serial"
    NONE = "no bundle"
    SILENT = "silent"


def state(holding: Holding, published: int | None, now: datetime, silent_after: timedelta) -> State:
    """Silent wins (what it last said may no longer be true); then none, then old."""
    if now - holding.reported_at > silent_after:
        return State.SILENT
    if holding.serial is None:
        return State.NONE
    if published is not None and holding.serial < published:
        return State.OLD
    return State.CURRENT
