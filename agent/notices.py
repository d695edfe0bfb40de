"""The one event every notice source emits, and the interface a source implements.

A source is started with a sink (an async callable taking a Notice) and stopped; it
normalises whatever its origin says into a `Notice` with a stable id, so the same reclaim
seen twice, or seen through two sources, is one id and the dedupe store drops the repeat.
A source of relay notices (NATS) emits `SignedMessage`s instead: the agent verifies their
signature against the bundle before anything else looks at them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from contracts.notice import ReclaimNotice


@dataclass(frozen=True)
class Notice:
    notice_id: str
    node: str
    deadline: datetime  # timezone-aware; the node is gone at this time
    reason: str
    source: str  # "nats", "metadata", ...
    # An early warning (a planned reclaim whose hard notice is still to come): only
    # contracts that opt in act on it; the node is neither cordoned nor drained.
    early: bool = False

    @staticmethod
    def from_reclaim(notice: ReclaimNotice, source: str) -> Notice:
        return Notice(
            notice.notice_id, notice.node, notice.deadline, notice.reason, source, notice.early
        )

    @staticmethod
    def stable_id(node: str, deadline: datetime, origin: str) -> str:
        """For sources that give no id: the same node, deadline and origin hash alike."""
        raw = f"{origin}/{node}/{deadline.isoformat()}".encode()
        return hashlib.sha256(raw).hexdigest()[:24]


@dataclass(frozen=True)
class SignedMessage:
    """A notice as it came off the wire, still to be verified: sources that carry relay
    notices hand these over untouched, and only the agent decides what they are."""

    raw: bytes
    source: str
    subject: str = ""


Sink = Callable[[Notice | SignedMessage], Awaitable[None]]


class NoticeSource(Protocol):
    """A monitor of one notice origin.

    `start` returns once the source is watching (or keeps retrying in the background when
    its origin is unreachable: a source never fails the agent's start). Every notice for
    this node goes to `sink`, possibly more than once. `stop` ends watching; it is
    idempotent and never raises.
    """

    name: str

    async def start(self, sink: Sink) -> None: ...

    async def stop(self) -> None: ...
