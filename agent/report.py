"""Drain outcomes: a local JSON-lines journal and NATS `sco.<region>.drain.<hall>.<node>`.

Reporting never blocks or fails a drain: NATS publishes run in background tasks with a
timeout, and every failure (journal or NATS) is logged and swallowed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from agent.natslink import NatsLink

log = logging.getLogger(__name__)


def drain_subject(region: str, hall: str, node: str) -> str:
    return f"sco.{region}.drain.{hall}.{node}"


class Reporter:
    def __init__(
        self, journal: Path, link: NatsLink | None, subject: str, *, timeout: float = 2.0
    ) -> None:
        self._journal = journal
        self._link = link
        self._subject = subject
        self._timeout = timeout
        self._pending: set[asyncio.Task[bool]] = set()

    def report(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, default=str, sort_keys=True)
        try:
            self._journal.parent.mkdir(parents=True, exist_ok=True)
            with self._journal.open("a") as fh:
                fh.write(line + "\n")
        except OSError as exc:
            log.error("journal %s not written: %s", self._journal, exc)
        if self._link is not None:
            task = asyncio.create_task(
                self._link.publish(self._subject, line.encode(), self._timeout)
            )
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def flush(self, limit_seconds: float) -> None:
        """Give in-flight publishes up to `limit_seconds` (at shutdown)."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=limit_seconds)
