"""Notices from a local JSON file, the way clouds expose instance metadata.

The file (when present) holds `{"action": "terminate", "time": "<ISO 8601 deadline>"}`
and optionally `"notice_id"` and `"reason"`; without an id one is derived from node,
deadline and path, so polling the same file again is the same notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from datetime import datetime
from pathlib import Path

from agent.notices import Notice, Sink

log = logging.getLogger(__name__)


class MetadataFileSource:
    name = "metadata"

    def __init__(self, path: Path, node: str, *, poll_seconds: float = 1.0) -> None:
        self._path = path
        self._node = node
        self._poll = poll_seconds
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
            raw = self._path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._complain(f"unreadable: {exc.strerror}")
            return None
        if not raw.strip():
            return None
        try:
            doc = json.loads(raw)
            if doc.get("action", "terminate") != "terminate":
                return None
            deadline = datetime.fromisoformat(str(doc["time"]))
            if deadline.tzinfo is None:
                raise ValueError("time has no timezone")
        except (ValueError, KeyError, AttributeError) as exc:
            self._complain(f"not a notice: {exc!r}")
            return None
        notice_id = str(doc.get("notice_id") or Notice.stable_id(self._node, deadline, "metadata"))
        return Notice(notice_id, self._node, deadline, str(doc.get("reason", "")), self.name)

    def _complain(self, why: str) -> None:
        if why != self._last_bad:  # once per distinct problem, not every poll
            log.error("metadata notice file %s %s", self._path, why)
            self._last_bad = why

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
