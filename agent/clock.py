"""The node's clock against the region's: measured offset, and the kernel's sync state.

A notice's deadline is the relay's time. A node whose clock runs fast refuses genuine
notices as expired; one that runs slow acts on expired ones. So the agent measures its
offset against the NATS server (the region's reference, beside the relays): it creates a
short-lived ephemeral consumer on the region's bundle stream (what it does anyway to fetch
the bundle; the server drops it after 5 s idle), and reads the server's `created` time;
the offset is that time minus the midpoint of the request (uncertain by half the round
trip). Notices are judged against the
corrected clock, within the configured skew bound (`notice_deadline_margin_seconds`).
The kernel's NTP state (adjtimex) is read too: `require_time_sync` refuses to start
unless one of them vouches for the clock.
"""

from __future__ import annotations

import ctypes
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from contracts.bounded import InputRejected, loads

log = logging.getLogger(__name__)

#: How long one measurement may take; a slower answer says little about the offset.
MEASURE_TIMEOUT_SECONDS = 3.0
#: The kernel's "clock not synchronised" status bit and return value (linux/timex.h).
_STA_UNSYNC = 0x0040
_TIME_ERROR = 5


@dataclass(frozen=True)
class OffsetSample:
    offset_seconds: float  # reference - local: add it to the local clock
    uncertainty_seconds: float  # half the round trip
    measured_at: datetime  # local clock


@dataclass(frozen=True)
class KernelSync:
    synchronised: bool
    max_error_seconds: float


def kernel_sync() -> KernelSync | None:
    """What the kernel says of its clock (Linux adjtimex, read-only); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None

    class Timex(ctypes.Structure):
        # struct timex: modes (int) + padding, offset, freq, maxerror, esterror (long),
        # status (int), ...; the rest is padding we never read (the kernel writes it).
        _fields_ = [
            ("modes", ctypes.c_uint),
            ("offset", ctypes.c_long),
            ("freq", ctypes.c_long),
            ("maxerror", ctypes.c_long),
            ("esterror", ctypes.c_long),
            ("status", ctypes.c_int),
            ("_rest", ctypes.c_byte * 256),
        ]

    try:
        # The process's own symbols, libc's among them: no find_library (ctypes.util, with
        # shutil, tempfile and an `ldconfig -p` child: ~0.5 MB the agent held for nothing).
        libc = ctypes.CDLL(None, use_errno=True)
        tx = Timex()
        state = libc.adjtimex(ctypes.byref(tx))  # modes 0: read only
    except (OSError, AttributeError):
        return None
    if state < 0:
        return None
    synced = state != _TIME_ERROR and not tx.status & _STA_UNSYNC
    return KernelSync(synced, tx.maxerror / 1e6)


def parse_created(data: bytes) -> tuple[datetime, str]:
    """The server's `created` time and the consumer's name from a consumer-create answer
    (parsed with bounds: it comes off the wire); ValueError if there is no time."""
    try:
        doc = loads(data, what="consumer create answer", max_bytes=64 * 1024)
    except InputRejected as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("created"), str):
        error = doc.get("error") if isinstance(doc, dict) else None
        raise ValueError(f"no server time in the answer ({str(error)[:200]})")
    created = datetime.fromisoformat(doc["created"][:64])
    if created.tzinfo is None:
        raise ValueError("server time without a timezone")
    name = doc.get("name")
    return created, name[:64] if isinstance(name, str) else ""


async def measure_nats_offset(
    nc: object, stream: str, local: Callable[[], float] = time.time
) -> OffsetSample:
    """One offset measurement against the NATS server behind `nc` (a connected
    nats.aio.client.Client), on `stream`, of the `local` clock (epoch seconds); raises on
    any failure."""
    request = json.dumps(
        {
            "stream_name": stream,
            "config": {
                "ack_policy": "none",
                "deliver_policy": "last",
                "inactive_threshold": 5_000_000_000,  # gone by itself in 5 s if not deleted
                "filter_subject": "$O.none.clock",  # matches nothing: nothing is delivered
            },
        }
    ).encode()
    started = local()
    reply = await nc.request(  # type: ignore[attr-defined]
        f"$JS.API.CONSUMER.CREATE.{stream}", request, timeout=MEASURE_TIMEOUT_SECONDS
    )
    ended = local()
    created, _ = parse_created(reply.data)
    # Not deleted: agents may create ephemeral consumers only (workers/nats_permissions.py);
    # the server drops it once idle (inactive_threshold).
    midpoint = (started + ended) / 2
    return OffsetSample(
        offset_seconds=created.timestamp() - midpoint,
        uncertainty_seconds=(ended - started) / 2,
        measured_at=datetime.fromtimestamp(ended, UTC),
    )


class Clock:
    """The local clock corrected by the last measured offset (none measured: local).
    `local`: the node's own clock in epoch seconds (tests give a skewed one)."""

    def __init__(self, local: Callable[[], float] = time.time) -> None:
        self.local = local
        self.sample: OffsetSample | None = None

    def record(self, sample: OffsetSample) -> None:
        self.sample = sample

    @property
    def offset(self) -> timedelta:
        return timedelta(seconds=self.sample.offset_seconds if self.sample else 0.0)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.local(), UTC) + self.offset
