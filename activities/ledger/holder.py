"""Reclaim-rate reads answered by the process that holds an embedded ledger.

The ledger consumer keeps its chDB engine open (`hold=True`, store.py). Another process's
read makes it close the engine and open it again afterwards, and chDB keeps ~2.5 MB of each
open for the life of the process: with the region worker's reclaim-rate read every 5 min,
the consumer's memory stepped up all day (docs/evidence.md). So the holder listens on a
Unix socket beside the ledger, `<dir>.sock`, and answers the reading child's request
(activities/ledger/child.py) itself, in a session of its own store (between its batches).
A reader asks there first; it starts the child only when nobody listens (no consumer
running, or the socket of one that died).

One request per connection: the child's JSON request, then the reader's half-close; one
JSON answer, `{"rates": {...}}` or `{"unavailable": reason}`. Requests are bounded as the
child's are (size, depth); a connection that sends nothing is cut after `IDLE_SECONDS`. The
socket has the ledger directory's owner and group permissions (read-write where the
directory allows reading), no more: whoever may ask it could open the ledger anyway.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from activities.ledger.child import (
    MAX_MESSAGE_BYTES,
    MAX_MESSAGE_DEPTH,
    answer_request,
    request_error,
)
from activities.ledger.store import LedgerStore, LedgerUnavailable
from contracts.bounded import loads

log = logging.getLogger(__name__)

#: A connection that has not finished its request in this long is cut (a stuck or hostile
#: local peer holds one thread for at most this long).
IDLE_SECONDS = 5.0
#: What a reader allows the holder beyond the ledger's lock wait: a batch may be under way.
ANSWER_SECONDS = 10.0


def socket_path(store: LedgerStore) -> Path | None:
    """`<dir>.sock` beside an on-disk chDB ledger; None for servers and chdb memory."""
    return None if store.path is None else store.path.with_name(store.path.name + ".sock")


def ask_holder(store: LedgerStore, request: dict[str, Any]) -> dict[str, float] | None:
    """The holder's answer to `request`; None when no holder listens (the caller reads
    another way). LedgerUnavailable when one listens and cannot answer."""
    path = socket_path(store)
    if path is None:
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(store.lock_timeout + ANSWER_SECONDS)
        try:
            sock.connect(str(path))
        except OSError as exc:  # no socket, a dead holder's, one this user may not use
            if not isinstance(exc, FileNotFoundError | ConnectionRefusedError):
                log.warning("ledger holder at %s: %s; reading it another way", path, exc)
            return None
        try:
            sock.sendall(json.dumps(request).encode())
            sock.shutdown(socket.SHUT_WR)
            raw = _read_to_end(sock, MAX_MESSAGE_BYTES + 1)
        except OSError as exc:
            raise LedgerUnavailable(store.dsn, f"the ledger's holder: {exc}") from exc
    try:
        answer = loads(
            raw,
            what="the holder's answer",
            max_bytes=MAX_MESSAGE_BYTES,
            max_depth=MAX_MESSAGE_DEPTH,
        )
        if "unavailable" in answer:
            reason = str(answer["unavailable"])
        else:
            return {str(pool): float(rate) for pool, rate in answer["rates"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LedgerUnavailable(store.dsn, f"the ledger's holder answered {raw[:80]!r}") from exc
    raise LedgerUnavailable(store.dsn, f"the ledger's holder: {reason}")


def _read_to_end(sock: socket.socket, limit: int) -> bytes:
    """What the peer sends until it closes its side, or `limit` bytes (a bounded read)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = sock.recv(min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


class HolderReads:
    """Answers readers of `store`'s ledger on its socket, a thread per connection, until
    closed. `on_answer` is called after each answered read (the consumer counts them)."""

    def __init__(self, store: LedgerStore, on_answer: Callable[[], None] | None = None) -> None:
        self._store = store
        self._on_answer = on_answer
        self.answered = 0
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Listen on the ledger's socket; False (logged: readers then start a child) when
        it cannot be made. Call while holding the ledger: a socket already there is stale."""
        path = socket_path(self._store)
        if path is None:
            return False
        try:
            path.unlink(missing_ok=True)
            server = socketserver.ThreadingUnixStreamServer(str(path), _Handler)
            mode = os.stat(path.parent).st_mode
            # rw for the owner, and for group and others where the directory lets them read.
            os.chmod(path, 0o600 | (0o060 if mode & 0o040 else 0) | (0o006 if mode & 0o004 else 0))
        except OSError as exc:
            log.warning("ledger: cannot answer reads on %s (%s); readers start a child", path, exc)
            return False
        server.daemon_threads = True
        server.holder = self  # type: ignore[attr-defined]  # the handler's way back
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="ledger-holder-reads", daemon=True
        )
        self._thread.start()
        log.info("ledger: answering reclaim-rate reads on %s", path)
        return True

    def answer(self, raw: bytes) -> dict[str, Any]:
        try:
            request = loads(
                raw, what="request", max_bytes=MAX_MESSAGE_BYTES, max_depth=MAX_MESSAGE_DEPTH
            )
            rates = answer_request(self._store, request)
        except LedgerUnavailable as exc:
            return {"unavailable": exc.reason}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return {"unavailable": request_error(exc)}
        self.answered += 1
        if self._on_answer is not None:
            self._on_answer()
        return {"rates": rates}

    def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        path = socket_path(self._store)
        if path is not None:
            path.unlink(missing_ok=True)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        holder: HolderReads = self.server.holder  # type: ignore[attr-defined]
        sock: socket.socket = self.request
        sock.settimeout(IDLE_SECONDS)
        try:
            raw = _read_to_end(sock, MAX_MESSAGE_BYTES + 1)
        except OSError:
            return  # it said nothing in time, or went away: nothing to answer
        sock.settimeout(None)
        answer = json.dumps(holder.answer(raw)).encode()
        with contextlib.suppress(OSError):  # the reader gave up meanwhile
            sock.sendall(answer)
