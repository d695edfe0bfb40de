"""Reads and drain bookings answered by the process that holds an embedded ledger.

The ledger consumer keeps its chDB engine open (`hold=True`, store.py). Another process's
session makes it close the engine and open it again afterwards, and chDB keeps ~2.5 MB of
each open for the life of the process: with the region worker's reclaim-rate read every
5 min, the consumer's memory stepped up all day (docs/evidence.md); and the drain intake
loaded the whole engine (~280 MB) to book its first report. So the holder listens on a Unix
socket beside the ledger, `<dir>.sock`, and does both itself, in sessions of its own store
(between its batches): the reading child's request (activities/ledger/child.py), and a
drain report's booking (`insert_drain`, as the intake would). A reader or the intake asks
there first, and reads or books another way only when nobody listens (no consumer running,
or the socket of one that died).

And a query of the ledger's readers (`sco ledger spend|reclaims|decisions|lost-work`,
`sco why`, the console's pages: `LedgerStore.read_session`), which would each take the
ledger from it the same way: it runs the query, read-only (the engine's `readonly`), and
sends the rows back; one too big for the socket is run by the asker itself, as before.

One request per connection, then the asker's half-close; one JSON answer. A request is
the child's (`{"pools", "start", "end", ...}`: `{"rates": {...}}`),
`{"op": "drain", "event", "region", "node"}` (`{"booked": rows}`, or `{"refused": reason,
"kind": rule}` for a report the ledger does not take) or `{"op": "query", "sql",
"parameters"}` (`{"columns", "rows"}`, values as activities/ledger/wire.py carries them, or
`{"too_big": bytes}`); `{"unavailable": reason}` when the ledger cannot be used.
Requests are bounded (4 MiB, a drain report's depth plus one, a query's text 64 KiB); a
connection that sends nothing is cut after `IDLE_SECONDS`. The socket has the ledger
directory's owner and group permissions (read-write where the directory allows reading),
no more: whoever may ask it could open the ledger anyway.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from activities.ledger.child import (
    MAX_MESSAGE_BYTES,
    answer_request,
    request_error,
)
from activities.ledger.lost_work import MAX_DEPTH as DRAIN_MAX_DEPTH
from activities.ledger.lost_work import DrainEventError, insert_drain
from activities.ledger.store import LedgerStore, LedgerUnavailable
from activities.ledger.wire import tagged, untagged
from contracts.bounded import loads

log = logging.getLogger(__name__)

#: A connection that has not finished its request in this long is cut (a stuck or hostile
#: local peer holds one thread for at most this long).
IDLE_SECONDS = 5.0
#: A drain report's own bound, in the request's "event".
MAX_DEPTH = DRAIN_MAX_DEPTH + 1
#: What a reader allows the holder beyond the ledger's lock wait: a batch may be under way.
ANSWER_SECONDS = 10.0
#: A query's answer larger than this is not sent (the asker runs the query itself).
MAX_ROWS_BYTES = MAX_MESSAGE_BYTES
#: The longest query text the holder takes.
MAX_SQL_CHARS = 65536


def socket_path(store: LedgerStore) -> Path | None:
    """`<dir>.sock` beside an on-disk chDB ledger; None for servers and chdb memory."""
    return None if store.path is None else store.path.with_name(store.path.name + ".sock")


def ask_holder(store: LedgerStore, request: dict[str, Any]) -> dict[str, float] | None:
    """The holder's rates for the child's `request`; None when no holder listens (the
    caller reads another way). LedgerUnavailable when one listens and cannot answer."""
    answer = _exchange(store, request)
    if answer is None:
        return None
    try:
        return {str(pool): float(rate) for pool, rate in answer["rates"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LedgerUnavailable(store.dsn, f"the ledger's holder answered {answer!r:.80}") from exc


def book_drain_with_holder(
    store: LedgerStore, event: dict[str, Any], region: str, *, node: str
) -> int | None:
    """The rows the holder booked for one drain report (`insert_drain`); None when no
    holder listens. DrainEventError when the ledger does not take the report (the same
    message and rule as booked here), LedgerUnavailable when it cannot be used."""
    answer = _exchange(store, {"op": "drain", "event": event, "region": region, "node": node})
    if answer is None:
        return None
    if "refused" in answer:
        raise DrainEventError(str(answer["refused"]), str(answer.get("kind", "ledger")))
    try:
        return int(answer["booked"])
    except (KeyError, TypeError, ValueError) as exc:
        raise LedgerUnavailable(store.dsn, f"the ledger's holder answered {answer!r:.80}") from exc


class HeldRows:
    """A query's rows as the holder sent them, read as the engine client's result is."""

    def __init__(self, columns: list[str], rows: list[list[Any]]) -> None:
        self.column_names = tuple(columns)
        self.result_rows = [tuple(row) for row in rows]

    def named_results(self) -> Iterator[dict[str, Any]]:
        for row in self.result_rows:
            yield dict(zip(self.column_names, row, strict=True))


class HeldReads:
    """Queries asked of the ledger's holder; when nobody listens there, or an answer is
    too big for the socket, run in a session of the store's own (`own()`: taking the
    ledger, as every read did before), for the rest of the reads too."""

    def __init__(self, store: LedgerStore, own: Callable[[], Any]) -> None:
        self._store, self._own = store, own
        self._session: Any = None  # the store's own session, once one was needed

    def query(self, query: str, parameters: dict[str, Any] | None = None) -> Any:
        if self._session is None:
            answer = _exchange(
                self._store, {"op": "query", "sql": query, "parameters": tagged(parameters or {})}
            )
            if answer is not None and "too_big" not in answer:
                try:
                    return HeldRows(list(answer["columns"]), untagged(answer["rows"]))
                except (KeyError, TypeError, ValueError) as exc:
                    raise LedgerUnavailable(
                        self._store.dsn, f"the ledger's holder answered {str(answer)[:80]}"
                    ) from exc
            if answer is not None:
                log.info(
                    "ledger: an answer of %s bytes; reading the ledger here", answer["too_big"]
                )
            self._session = self._own()
        return self._session.query(query, parameters=parameters)


def _exchange(store: LedgerStore, request: dict[str, Any]) -> dict[str, Any] | None:
    """The holder's answer; None when nobody listens on the ledger's socket."""
    path = socket_path(store)
    if path is None:
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(store.lock_timeout + ANSWER_SECONDS)
        try:
            sock.connect(str(path))
        except OSError as exc:  # no socket, a dead holder's, one this user may not use
            if not isinstance(exc, FileNotFoundError | ConnectionRefusedError):
                log.warning("ledger holder at %s: %s; using the ledger another way", path, exc)
            return None
        try:
            sock.sendall(json.dumps(request).encode())
            sock.shutdown(socket.SHUT_WR)
            raw = _read_to_end(sock, MAX_MESSAGE_BYTES + 1)
        except OSError as exc:
            raise LedgerUnavailable(store.dsn, f"the ledger's holder: {exc}") from exc
    try:
        answer = loads(
            raw, what="the holder's answer", max_bytes=MAX_MESSAGE_BYTES, max_depth=MAX_DEPTH
        )
        if not isinstance(answer, dict):
            raise TypeError(type(answer).__name__)
    except (ValueError, TypeError) as exc:
        raise LedgerUnavailable(store.dsn, f"the ledger's holder answered {raw[:80]!r}") from exc
    if "unavailable" in answer:
        raise LedgerUnavailable(store.dsn, f"the ledger's holder: {answer['unavailable']}")
    return answer


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


class HolderSocket:
    """Answers readers of `store`'s ledger on its socket, a thread per connection, until
    closed. `on_answer(op)` is called after each request answered ("rates", "drain"; the
    consumer counts them)."""

    def __init__(self, store: LedgerStore, on_answer: Callable[[str], None] | None = None) -> None:
        self._store = store
        self._on_answer = on_answer
        self.answered = {"rates": 0, "drain": 0, "query": 0}
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._thread: threading.Thread | None = None

    def start(self, *, take_over: bool = True) -> bool:
        """Listen on the ledger's socket; False (logged: readers then start a child) when
        it cannot be made. While holding the ledger a socket already there is a dead
        holder's, and is replaced. Before (`take_over=False`, so that a reader at start-up
        is answered here instead of taking the ledger), one that answers is another
        holder's, still running: it is left alone and False is returned."""
        path = socket_path(self._store)
        if path is None:
            return False
        if not take_over and _listening(path):
            log.info("ledger: %s answers already; listening once the ledger is held", path)
            return False
        try:
            path.unlink(missing_ok=True)
            server = socketserver.ThreadingUnixStreamServer(str(path), _Handler)
            mode = os.stat(path.parent).st_mode
            # rw for the owner, and for group and others where the directory lets them read.
            os.chmod(path, 0o600 | (0o060 if mode & 0o040 else 0) | (0o006 if mode & 0o004 else 0))
        except OSError as exc:
            log.warning(
                "ledger: cannot answer on %s (%s); readers start a child, the intake opens it",
                path,
                exc,
            )
            return False
        server.daemon_threads = True
        server.holder = self  # type: ignore[attr-defined]  # the handler's way back
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="ledger-holder", daemon=True
        )
        self._thread.start()
        log.info("ledger: answering reclaim-rate reads and drain bookings on %s", path)
        return True

    def answer(self, raw: bytes) -> dict[str, Any]:
        try:
            request = loads(raw, what="request", max_bytes=MAX_MESSAGE_BYTES, max_depth=MAX_DEPTH)
            if not isinstance(request, dict):
                raise TypeError(f"a {type(request).__name__}, not an object")
            op = request.get("op", "rates")
            if op == "rates":
                answer: dict[str, Any] = {"rates": answer_request(self._store, request)}
            elif op == "drain":
                answer = self._book(request)
            elif op == "query":
                answer = self._query(request)
            else:
                raise ValueError(f"op {str(op)[:40]!r} is not rates, drain or query")
        except LedgerUnavailable as exc:
            return {"unavailable": exc.reason}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return {"unavailable": request_error(exc)}
        self.answered[op] += 1
        if self._on_answer is not None:
            self._on_answer(op)
        return answer

    def _book(self, request: dict[str, Any]) -> dict[str, Any]:
        event, region, node = request["event"], request["region"], request["node"]
        if not (isinstance(event, dict) and isinstance(region, str) and isinstance(node, str)):
            raise TypeError("event must be an object, region and node strings")
        try:
            return {"booked": insert_drain(self._store, event, region, node=node)}
        except DrainEventError as exc:
            return {"refused": str(exc), "kind": exc.kind}
        except LedgerUnavailable:
            raise
        except Exception as exc:  # the ledger refused the rows, as the intake's own booking says
            return {"refused": f"ledger refused it: {type(exc).__name__}: {str(exc)[:300]}"}

    def _query(self, request: dict[str, Any]) -> dict[str, Any]:
        sql, parameters = request["sql"], untagged(request.get("parameters") or {})
        if not (isinstance(sql, str) and isinstance(parameters, dict)):
            raise TypeError("sql must be a string, parameters an object")
        if len(sql) > MAX_SQL_CHARS:
            raise ValueError(f"sql of {len(sql)} characters (at most {MAX_SQL_CHARS})")
        try:
            with self._store.session() as client:
                # The engine refuses anything but a read: whoever asks reads, never writes.
                result = client.query(sql, parameters=parameters, settings={"readonly": 1})
        except LedgerUnavailable:
            raise
        except Exception as exc:  # the engine refused the query: its reason, to the asker
            raise LedgerUnavailable(self._store.dsn, f"{type(exc).__name__}: {exc}") from exc
        answer = {"columns": list(result.column_names), "rows": tagged(result.result_rows)}
        size = len(json.dumps(answer))
        return {"too_big": size} if size > MAX_ROWS_BYTES else answer

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


def _listening(path: Path) -> bool:
    """Whether a process accepts connections on `path` (the probe says nothing: the
    holder answers it with one line and goes on)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(IDLE_SECONDS)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        holder: HolderSocket = self.server.holder  # type: ignore[attr-defined]
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
