"""What `sco dev up` started, on disk, so `status` and `down` touch only that."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from workers.devbox.process import ProcessRecord


class BoxState(BaseModel):
    processes: dict[str, ProcessRecord] = {}
    #: The regions `up --workers` started processes for (empty: the settings' region).
    regions: list[str] = []
    #: The profile `up` ran with (`status` and `down` use it): default or secure.
    profile: Literal["default", "secure"] = "default"


class StateFile:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "devbox.json"
        self._lock_path = data_dir / "devbox.lock"

    @contextmanager
    def locked(self) -> Iterator[BoxState]:
        """Hold the box lock (one `up`/`down` at a time) and save the state on exit."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self.read()
            try:
                yield state
            finally:
                self._write(state)

    def read(self) -> BoxState:
        if not self.path.is_file():
            return BoxState()
        return BoxState.model_validate(json.loads(self.path.read_text()))

    def _write(self, state: BoxState) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(state.model_dump_json(indent=2))
        tmp.replace(self.path)
