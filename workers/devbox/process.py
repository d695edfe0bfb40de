"""Start, find and stop the processes the region in a box owns.

A process is recorded with its pid and exact command line; `stop` checks the command
line still matches before it signals, so a recycled pid is never killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path

from pydantic import BaseModel

_EXEC_GRACE_S = 5.0


class DevboxError(RuntimeError):
    """A one-line, user-facing reason the box cannot do what was asked."""


class ProcessRecord(BaseModel):
    pid: int
    argv: list[str]
    log: str
    started_at: float
    #: What /proc shows once the process retitled itself (nginx's master), if it does.
    title: str = ""


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require_free_port(service: str, host: str, port: int) -> None:
    if port_open(host, port):
        raise DevboxError(
            f"{service}: port {host}:{port} is taken by another process; free it or "
            f"configure another address"
        )


def require_binary(service: str, path: Path | str | None, hint: str) -> str:
    if path is None or not Path(path).is_file() or not os.access(path, os.X_OK):
        raise DevboxError(f"{service}: binary {path or '(none)'} not found; {hint}")
    return str(path)


class Spawned:
    """Every process `start` spawns inside `spawning()`, recorded the moment it exists. A
    service's start spawns, then waits for it to answer: a Ctrl-C or a failure in that
    wait used to leave a process nobody had recorded (an orphaned Kafka broker after an
    interrupted `sco dev up`). The caller stops what is here on unwind."""

    def __init__(self) -> None:
        self.records: list[ProcessRecord] = []
        self._holding = False
        self._held = False

    def interrupt_now(self) -> bool:
        """For a SIGINT/SIGTERM handler: False from the fork until the process is recorded
        (`start` raises the held KeyboardInterrupt right after)."""
        if self._holding:
            self._held = True
            return False
        return True

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[ProcessRecord]]:
        self._holding = True
        try:
            yield self.records
        finally:
            self._holding = False
            held, self._held = self._held, False
        if held:
            raise KeyboardInterrupt


_SPAWNED: ContextVar[Spawned | None] = ContextVar("_SPAWNED", default=None)


@contextlib.contextmanager
def spawning() -> Iterator[Spawned]:
    """Record every process `start` spawns in the block (see Spawned)."""
    spawned = Spawned()
    token = _SPAWNED.set(spawned)
    try:
        yield spawned
    finally:
        _SPAWNED.reset(token)


def start(
    argv: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
    title: str = "",
) -> ProcessRecord:
    """Start a detached process (own session, so a terminal's Ctrl-C does not reach it)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    spawned = _SPAWNED.get()
    recording: contextlib.AbstractContextManager[list[ProcessRecord]] = (
        spawned.recording() if spawned else contextlib.nullcontext([])
    )
    with recording as records:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                user=user,
            )
        record = ProcessRecord(
            pid=proc.pid, argv=list(argv), log=str(log_path), started_at=time.time(), title=title
        )
        records.append(record)
    return record


def alive(record: ProcessRecord) -> bool:
    """True when the pid runs and still is the command we started."""
    try:
        stat = Path(f"/proc/{record.pid}/stat").read_text()
        raw = Path(f"/proc/{record.pid}/cmdline").read_bytes()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):  # exited, not yet reaped
        return False
    if not raw:
        # The command line reads empty while exec is still loading the program: right
        # after start this is our process, not a recycled pid.
        return time.time() - record.started_at < _EXEC_GRACE_S
    if record.title and raw.rstrip(b"\0") == record.title.encode():
        return True
    return raw.rstrip(b"\0").split(b"\0") == [a.encode() for a in record.argv]


def stop(record: ProcessRecord, timeout: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after `timeout`."""
    if not alive(record):
        return
    _signal_group(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(record.pid)
        if not alive(record):
            return
        time.sleep(0.1)
    _signal_group(record.pid, signal.SIGKILL)
    time.sleep(0.2)
    _reap(record.pid)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # the process leads its own session, hence its own group
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def last_log_line(log: Path, tail_bytes: int = 4096) -> str:
    """The last non-empty line of a process's log (its last words, often why it exited),
    read from the log's last `tail_bytes` only and cut to 300 characters; "" when none."""
    try:
        with log.open("rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - tail_bytes, 0))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    said = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return said[:300]


def wait_until(
    what: str, check: Callable[[], bool], *, timeout: float, record: ProcessRecord | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if record is not None and not alive(record):
            said = last_log_line(Path(record.log))
            raise DevboxError(
                f"{what}: process exited during start{f' ({said})' if said else ''}; "
                f"see {record.log}"
            )
        time.sleep(0.2)
    hint = f"; see {record.log}" if record else ""
    raise DevboxError(f"{what}: not ready after {timeout:.0f} s{hint}")
