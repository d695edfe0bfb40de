"""Notices from a local JSON file, the way clouds expose instance metadata: the LOCAL
FALLBACK for when the signed relay notices cannot arrive, never a second way in.

The file (when present) holds `{"action": "terminate", "time": "<ISO 8601 deadline>"}`
and optionally `"notice_id"` and `"reason"`; without an id one is derived from node,
deadline and path, so polling the same file again is the same notice.

The file carries no signature, so only root may write it: it is refused (logged once, never
drains) unless it is a regular file owned by `owner_uid` (root) and neither group- nor
world-writable. Its deadline is bounded like a relay notice's: one already past (1970) or
further away than `max_ahead` (9999) is refused. It is read with a size bound and a bounded
parse (contracts/bounded.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agent.notices import Notice, Sink
from contracts.bounded import InputRejected, loads

log = logging.getLogger(__name__)

#: Largest metadata file read (a real one is ~100 bytes).
MAX_METADATA_BYTES = 4096
#: Default bound on how far ahead a metadata deadline may lie.
DEFAULT_MAX_AHEAD = timedelta(hours=1)


class MetadataFileSource:
    name = "metadata"

    def __init__(
        self,
        path: Path,
        node: str,
        *,
        poll_seconds: float = 1.0,
        owner_uid: int = 0,
        max_ahead: timedelta = DEFAULT_MAX_AHEAD,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._path = path
        self._node = node
        self._poll = poll_seconds
        self._owner = owner_uid
        self._max_ahead = max_ahead
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._last_bad: str | None = None

    async def start(self, sink: Sink) -> None:
        self._task = asyncio.create_task(self._run(sink), name="metadata-notices")

    async def _run(self, sink: Sink) -> None:
        while True:
            notice = self.read()
            if notice is not None:
                await sink(notice)
            await asyncio.sleep(self._poll)

    def read(self) -> Notice | None:
        try:
            # O_NOFOLLOW: a symlink planted in the file's place is refused, not followed.
            fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._complain(f"unreadable: {exc.strerror}")
            return None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            why = self._untrusted(st)
            if why:
                self._complain(f"REFUSED: {why}")
                return None
            raw = fh.read(MAX_METADATA_BYTES + 1)
        if not raw.strip():
            return None
        try:
            doc = loads(raw, what="metadata notice", max_bytes=MAX_METADATA_BYTES)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            if doc.get("action", "terminate") != "terminate":
                return None
            deadline = datetime.fromisoformat(str(doc["time"])[:64])
            if deadline.tzinfo is None:
                raise ValueError("time has no timezone")
        except (InputRejected, ValueError, KeyError) as exc:
            self._complain(f"not a notice: {exc}")
            return None
        now = self._clock()
        if deadline <= now:
            self._complain(f"REFUSED: deadline {deadline.isoformat()} already passed")
            return None
        if deadline - now > self._max_ahead:
            self._complain(
                f"REFUSED: deadline {deadline.isoformat()} is more than "
                f"{self._max_ahead.total_seconds():.0f} s ahead"
            )
            return None
        notice_id = str(doc.get("notice_id") or Notice.stable_id(self._node, deadline, "metadata"))
        return Notice(
            notice_id[:64], self._node, deadline, str(doc.get("reason", ""))[:200], self.name
        )

    def _untrusted(self, st: os.stat_result) -> str:
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_uid != self._owner:
            return f"owned by uid {st.st_uid}, not {self._owner} (root)"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"group- or world-writable (mode {stat.S_IMODE(st.st_mode):o})"
        return ""

    def _complain(self, why: str) -> None:
        if why != self._last_bad:  # once per distinct problem, not every poll
            log.error("metadata notice file %s %s", self._path, why)
            self._last_bad = why

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
