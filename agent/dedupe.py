"""The deduplicating store of notices: a repeated notice is acted on once, across restarts.

Bounded (oldest entries forgotten first) and persisted as one JSON file written
atomically beside the journal. An entry is `started` when a drain begins and `done` when
it ends; after a restart a `done` notice is skipped and a `started` one is drained again
(every drain step is idempotent: cordon, requeue, checkpoint requests).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Literal

from contracts.atomic import write_atomic

log = logging.getLogger(__name__)

State = Literal["started", "done"]


class DedupeStore:
    def __init__(self, path: Path | None, *, capacity: int = 1024) -> None:
        self._path = path
        self._capacity = capacity
        self._seen: OrderedDict[str, State] = OrderedDict()
        self._restored_started: set[str] = set()
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text())
            entries = data["seen"]
            for notice_id, state in entries:
                if state in ("started", "done"):
                    self._seen[str(notice_id)] = state
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # A damaged store costs at most a repeated (idempotent) drain, never a missed one.
            log.error("dedupe store %s unreadable, starting empty: %s", path, exc)
            self._seen.clear()
            return
        self._restored_started = {k for k, v in self._seen.items() if v == "started"}
        if self._restored_started:
            log.warning(
                "drains interrupted by a restart will run again: %s",
                ", ".join(sorted(self._restored_started)),
            )

    def claim(self, notice_id: str) -> bool:
        """True when this notice should be drained now; records it as started."""
        state = self._seen.get(notice_id)
        if state == "done":
            return False
        if state == "started" and notice_id not in self._restored_started:
            return False  # in flight in this process
        self._restored_started.discard(notice_id)
        self._seen[notice_id] = "started"
        self._seen.move_to_end(notice_id)
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        self._save()
        return True

    def finish(self, notice_id: str) -> None:
        self._seen[notice_id] = "done"
        self._save()

    def state(self, notice_id: str) -> State | None:
        return self._seen.get(notice_id)

    def __len__(self) -> int:
        return len(self._seen)

    def _save(self) -> None:
        if self._path is None:
            return
        try:
            payload = json.dumps({"seen": [[k, v] for k, v in self._seen.items()]})
            write_atomic(self._path, payload.encode())
        except OSError as exc:
            log.error("dedupe store %s not saved: %s", self._path, exc)
