"""The workload's end: a daemon thread answering the agent on a Unix socket."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from agent.checkpoint.protocol import MAX_LINE, ProtocolError, Reply, Saved, decode_request

log = logging.getLogger(__name__)

#: `callback(reason, deadline) -> path` (or a Saved with what the save does not keep);
#: raising means "could not", reported to the agent.
Callback = Callable[[str, float], str | Saved]

DEFAULT_DIR = Path("/run/sco-agent/checkpoint")


def default_socket_path(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    if explicit := env.get("SCO_CHECKPOINT_SOCKET"):
        return Path(explicit)
    directory = Path(env.get("SCO_CHECKPOINT_SOCKET_DIR", str(DEFAULT_DIR)))
    if job := env.get("SLURM_JOB_ID"):
        return directory / f"slurm-{job}.sock"
    if (ns := env.get("POD_NAMESPACE")) and (pod := env.get("POD_NAME")):
        return directory / f"pod-{ns}-{pod}.sock"
    return directory / f"pid-{os.getpid()}.sock"


class CheckpointServer:
    """Serves `handlers` (op -> callback) until `close()`; one request at a time.

    `answered` is set once an ok reply to `checkpoint` or `decommission` has been sent
    (`answered_path` holds its path): from then on the agent knows where the state went
    and the workload may exit. Exiting from inside the callback instead would race the
    reply, and the agent would force a job that had in fact saved. An `early_checkpoint`
    runs the checkpoint callback too but sets nothing: the workload keeps running on its
    still usable node (`early_saves` counts them). `draining` is set as a drain's
    request arrives: `while not server.draining.is_set(): step()` then
    `server.answered.wait()` loses no step to the time the reply takes.
    """

    def __init__(self, path: Path, handlers: dict[str, Callback]) -> None:
        self.path = path
        self._handlers = handlers
        self.answered = threading.Event()
        self.answered_path = ""
        self.early_saves = 0  # early checkpoints answered (the workload kept running)
        # Set when a drain's checkpoint or decommission request arrives, before its callback
        # runs: a training loop that checks it takes no step after the one being saved
        # (none is lost), then waits for `answered` to exit.
        self.draining = threading.Event()
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a socket left by an earlier run of this job
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        os.chmod(path, 0o660)
        self._sock.listen(4)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="sco-checkpoint", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn:
                try:
                    self._handle(conn)
                except OSError as exc:
                    log.warning("checkpoint connection failed: %s", exc)

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        buf = b""
        while b"\n" not in buf and len(buf) < MAX_LINE:
            chunk = conn.recv(4096)
            if not chunk:
                break
            buf += chunk
        conn.settimeout(None)
        try:
            request = decode_request(buf.split(b"\n", 1)[0])
        except ProtocolError as exc:
            conn.sendall(Reply(False, error=str(exc)).encode())
            return
        if request.op == "ping":
            conn.sendall(Reply(True).encode())
            return
        early = request.op == "early_checkpoint"
        handler = self._handlers.get("checkpoint" if early else request.op)
        if handler is None:
            conn.sendall(Reply(False, error=f"no handler for {request.op}").encode())
            return
        if not early:
            self.draining.set()
        try:
            result = handler(request.reason, request.deadline)
        except Exception as exc:  # the workload's failure goes back to the agent
            log.exception("%s callback failed", request.op)
            self.draining.clear()  # nothing saved: the job goes on until forced
            conn.sendall(Reply(False, error=f"{type(exc).__name__}: {exc}").encode())
            return
        saved = result if isinstance(result, Saved) else Saved(str(result))
        reply = Reply(True, saved.path, lost_steps=saved.lost_steps, lost_tasks=saved.lost_tasks)
        conn.sendall(reply.encode())
        if early:  # the node stays usable: the workload goes on, the hard notice follows
            self.early_saves += 1
            return
        self.answered_path = saved.path
        self.answered.set()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def __enter__(self) -> CheckpointServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def register(
    checkpoint_now: Callback | None = None,
    *,
    decommission: Callback | None = None,
    socket_path: Path | None = None,
) -> CheckpointServer:
    """Start answering the agent; returns the running server (close it to stop)."""
    handlers: dict[str, Callback] = {}
    if checkpoint_now is not None:
        handlers["checkpoint"] = checkpoint_now
    if decommission is not None:
        handlers["decommission"] = decommission
    if not handlers:
        raise ValueError("register needs a checkpoint_now or a decommission callback")
    return CheckpointServer(socket_path or default_socket_path(), handlers)
