"""Where a long-running process's Python memory goes, on demand: tracemalloc snapshots.

An operator starts a process with `PYTHONTRACEMALLOC=N` (Python's own switch: tracing from
the first import, N frames kept per allocation). The process then arms itself
(`arm`): it writes `<dir>/<service>-<pid>.armed` and, on each SIGUSR2, a snapshot
`<dir>/<service>-<pid>-<n>.tracemalloc.json` (n = 1, 2, ...): the size and count of live
allocations per traceback. `sco dev memory-diff OLD NEW` prints the tracebacks that grew most
between two snapshots of one process. JSON, not tracemalloc's own pickle: reading a file must
never run code from it.

Only a process that was started traced arms: SIGUSR2's default action ends a process, so
the `.armed` file is what says a process may be sent it. Tracing costs CPU and memory (a
notice relay traced with 6 frames held 200 MB, 53 MB untraced; every allocation is slower):
it is for a diagnosis, never left on. Memory that
Python's allocator does not see (the Temporal SDK's Rust core, OpenSSL, librdkafka) is not
in a snapshot: a process whose RSS grows while its snapshots do not grows there.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import threading
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.atomic import write_atomic
from contracts.bounded import InputRejected, loads

log = logging.getLogger(__name__)

SUFFIX = ".tracemalloc.json"
#: The largest snapshot `load` reads (a traced worker writes ~5-20 MB).
MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024

#: Left out of a snapshot: the tracer's own allocations, and the snapshot being taken (any
#: traceback through this file). Imports stay in: a module loaded late is growth too.
_NOISE = (
    tracemalloc.Filter(False, "*/tracemalloc.py"),
    tracemalloc.Filter(False, "*/workers/memory_trace.py", all_frames=True),
)


class SnapshotError(Exception):
    """A file that is not a readable snapshot (its path and why, one line)."""


def snapshot(service: str) -> dict[str, Any]:
    """Live allocations per traceback (the tracer's and the snapshot's own left out)."""
    taken = tracemalloc.take_snapshot().filter_traces(_NOISE)
    return {
        "service": service,
        "pid": os.getpid(),
        "frames_kept": tracemalloc.get_traceback_limit(),
        "stats": [
            {
                "frames": [f"{f.filename}:{f.lineno}" for f in s.traceback],
                "size": s.size,
                "count": s.count,
            }
            for s in taken.statistics("traceback")
        ],
    }


def arm(service: str, directory: Path) -> Path | None:
    """When tracing: SIGUSR2 writes a snapshot to `directory`; returns the `.armed` file,
    written once the handler is in place. Not tracing, or nowhere to write: None (the
    process runs on, unarmed). Call from the main thread. The snapshot starts when the main
    thread next runs Python code: a service's event loop wakes within seconds, but a main
    thread parked in a bare blocking read can sleep through a signal that lands just
    before the read."""
    if not tracemalloc.is_tracing():
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("tracing memory, but not armed: %s: %s", directory, exc.strerror)
        return None
    stem = directory / f"{service}-{os.getpid()}"
    numbers = itertools.count(1)
    lock = threading.Lock()

    def write(n: int) -> None:
        # A snapshot of a large process takes seconds: off the signal handler (the main
        # thread runs the event loop), one at a time.
        with lock:
            path = Path(f"{stem}-{n}{SUFFIX}")
            try:
                write_atomic(path, json.dumps(snapshot(service)).encode())
            except OSError as exc:  # a full disk fails the snapshot, never the process
                log.warning("tracemalloc snapshot %s not written: %s", path, exc.strerror)
                return
            log.warning("tracemalloc snapshot written: %s", path)

    def on_signal(_sig: int, _frame: object) -> None:
        threading.Thread(target=write, args=(next(numbers),), daemon=True).start()

    signal.signal(signal.SIGUSR2, on_signal)
    armed = Path(f"{stem}.armed")
    try:
        write_atomic(armed, f"{tracemalloc.get_traceback_limit()}\n".encode())
    except OSError as exc:
        log.warning("tracing memory, but not armed: %s: %s", armed, exc.strerror)
        return None
    log.warning(
        "tracing memory (%d frames): kill -USR2 %d writes %s-N%s",
        tracemalloc.get_traceback_limit(),
        os.getpid(),
        stem,
        SUFFIX,
    )
    return armed


@dataclass(frozen=True)
class Growth:
    """One traceback's change between two snapshots."""

    size_diff_kb: float
    size_kb: float
    count_diff: int
    frames: tuple[str, ...]  # "file:line", the innermost last

    def as_dict(self) -> dict[str, object]:
        return {
            "size_diff_kb": self.size_diff_kb,
            "size_kb": self.size_kb,
            "count_diff": self.count_diff,
            "frames": list(self.frames),
        }


Sites = dict[tuple[str, ...], tuple[int, int]]  # frames -> (bytes, allocations)


def load(path: Path) -> Sites:
    """A snapshot `arm` wrote, read back; anything else is one `SnapshotError`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SnapshotError(f"{path}: no such file") from None
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        doc = loads(raw, what=str(path), max_bytes=MAX_SNAPSHOT_BYTES)
    except InputRejected as exc:
        raise SnapshotError(str(exc)) from None
    stats = doc.get("stats") if isinstance(doc, dict) else None
    if not isinstance(stats, list):
        raise SnapshotError(f"{path}: not a memory snapshot (no stats list)")
    sites: Sites = {}
    for n, row in enumerate(stats):
        frames, size, count = (
            (row.get(k) for k in ("frames", "size", "count"))
            if isinstance(row, dict)
            else (None, None, None)
        )
        if (
            not isinstance(frames, list)
            or not all(isinstance(f, str) for f in frames)
            or type(size) is not int
            or type(count) is not int
            or size < 0
            or count < 0
        ):
            raise SnapshotError(
                f"{path}: stats[{n}]: wants frames (strings), size and count (>= 0)"
            )
        key = tuple(frames)
        was = sites.get(key, (0, 0))
        sites[key] = (was[0] + size, was[1] + count)
    return sites


def growth(old: Sites, new: Sites, top: int) -> list[Growth]:
    """The `top` tracebacks by bytes grown from `old` to `new` (those that grew only)."""
    grown = [
        (size - old.get(frames, (0, 0))[0], frames, size, count - old.get(frames, (0, 0))[1])
        for frames, (size, count) in new.items()
    ]
    grown.sort(key=lambda g: g[0], reverse=True)
    return [
        Growth(
            size_diff_kb=round(diff / 1024, 1),
            size_kb=round(size / 1024, 1),
            count_diff=count_diff,
            frames=frames,
        )
        for diff, frames, size, count_diff in grown[:top]
        if diff > 0
    ]


def total_kb(sites: Sites) -> float:
    return round(sum(size for size, _ in sites.values()) / 1024, 1)
