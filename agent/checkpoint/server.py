"""The workload's end: a daemon thread answering the agent on a Unix socket."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.checkpoint import naming, peer
from agent.checkpoint.protocol import MAX_LINE, ProtocolError, Reply, Saved, decode_request

log = logging.getLogger(__name__)

#: `callback(reason, deadline) -> path` (or a Saved with what the save does not keep);
#: raising means "could not", reported to the agent.
Callback = Callable[[str, float], str | Saved]

DEFAULT_DIR = Path("/run/sco-agent/checkpoint")
#: How long a connection may take to send its request line (then it is dropped).
REQUEST_SECONDS = 5.0
#: Connections served at once; more are closed at once (the agent opens one per drain).
MAX_CONNECTIONS = 8
#: How often a workload started before the agent made its job directory looks again.
_DIR_POLL_SECONDS = 0.5


def default_socket_path(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    if explicit := env.get("SCO_CHECKPOINT_SOCKET"):
        return Path(explicit)
    directory = Path(env.get("SCO_CHECKPOINT_SOCKET_DIR", str(DEFAULT_DIR)))
    return naming.job_socket(directory, naming.name_from_env(env, os.getpid()))


class CheckpointServer:
    """Serves `handlers` (op -> callback) until `close()`.

    Each connection has its own thread and a deadline for its request
    (`REQUEST_SECONDS`): a slow or silent connection never delays another. Callbacks run
    one at a time. Only the node agent is answered (`agent.checkpoint.peer.agent_uids`:
    root, this process's user, the owner of the socket dir); anyone else is refused
    before its request is read, and `refused` counts them.

    The socket's directory is the job's own (`agent.checkpoint.jobdirs`): when it is not
    there yet (the agent makes it on its next pass over the node's jobs) and cannot be
    made here, the server waits for it in the background; `listening` is set once the
    socket is bound.

    `answered` is set once an ok reply to `checkpoint` or `decommission` has been sent
    (`answered_path` holds its path): from then on the agent knows where the state went
    and the workload may exit. Exiting from inside the callback instead would race the
    reply, and the agent would force a job that had in fact saved. An `early_checkpoint`
    runs the checkpoint callback too but sets nothing: the workload keeps running on its
    still usable node (`early_saves` counts them). `draining` is set as a drain's
    request arrives: `while not server.draining.is_set(): step()` then
    `server.answered.wait()` loses no step to the time the reply takes.
    """

    def __init__(
        self,
        path: Path,
        handlers: dict[str, Callback],
        *,
        allowed_uids: frozenset[int] | None = None,
    ) -> None:
        self.path = path
        self._handlers = handlers
        self._allowed = allowed_uids
        self.answered = threading.Event()
        self.answered_path = ""
        self.early_saves = 0  # early checkpoints answered (the workload kept running)
        self.refused = 0  # connections from someone other than the agent
        # Set when a drain's checkpoint or decommission request arrives, before its callback
        # runs: a training loop that checks it takes no step after the one being saved
        # (none is lost), then waits for `answered` to exit.
        self.draining = threading.Event()
        self.listening = threading.Event()
        self._callback = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._closed = threading.Event()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self._directory_ready():
            self._bind()
        self._thread = threading.Thread(target=self._serve, name="sco-checkpoint", daemon=True)
        self._thread.start()

    def _directory_ready(self) -> bool:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except PermissionError:
            return False  # the agent makes it: wait in the background
        return True

    def _bind(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a socket left by an earlier run of this job
        self._sock.bind(str(self.path))
        # Open mode: the job's directory (its user and the agent only) is the gate, and the
        # peer check below answers only the agent.
        os.chmod(self.path, 0o666)
        if self._allowed is None:
            self._allowed = peer.agent_uids(self.path)
        self._sock.listen(MAX_CONNECTIONS)
        self.listening.set()

    def _serve(self) -> None:
        if not self.listening.is_set():
            log.info("waiting for the node agent to make %s", self.path.parent)
            while not self._closed.wait(_DIR_POLL_SECONDS):
                if self.path.parent.is_dir():
                    try:
                        self._bind()
                        break
                    except OSError as exc:
                        log.warning("cannot bind %s yet: %s", self.path, exc)
            else:
                return
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                conn.close()  # too many at once (only the job's user and the agent can)
                continue
            threading.Thread(
                target=self._connection, args=(conn,), name="sco-checkpoint-conn", daemon=True
            ).start()

    def _connection(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._handle(conn)
        except OSError as exc:
            log.warning("checkpoint connection failed: %s", exc)
        finally:
            self._slots.release()

    def _read_request(self, conn: socket.socket) -> bytes:
        deadline = time.monotonic() + REQUEST_SECONDS
        buf = b""
        while b"\n" not in buf and len(buf) <= MAX_LINE:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no request line in time")
            conn.settimeout(left)
            chunk = conn.recv(4096)
            if not chunk:
                break
            buf += chunk
        conn.settimeout(None)
        return buf.split(b"\n", 1)[0]

    def _handle(self, conn: socket.socket) -> None:
        who = peer.peer_credentials(conn)
        if self._allowed is not None and who.uid not in self._allowed:
            self.refused += 1
            log.warning("refused a checkpoint connection from uid %d (pid %d)", who.uid, who.pid)
            conn.sendall(Reply(False, error=f"uid {who.uid} is not the node agent").encode())
            return
        try:
            request = decode_request(self._read_request(conn))
        except (ProtocolError, TimeoutError) as exc:
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
        with self._callback:
            self._run(conn, request.op, request.reason, request.deadline, handler, early)

    def _run(
        self,
        conn: socket.socket,
        op: str,
        reason: str,
        deadline: float,
        handler: Callback,
        early: bool,
    ) -> None:
        if not early:
            self.draining.set()
        try:
            result = handler(reason, deadline)
        except Exception as exc:  # the workload's failure goes back to the agent
            log.exception("%s callback failed", op)
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
