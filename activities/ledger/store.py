"""The ledger's storage: lifecycle events in ClickHouse, embedded (chDB) or a server.

An embedded chDB ledger is a directory that only one process at a time may hold open.
The ledger consumer and `sco` CLI queries run in different processes, so on a `chdb://`
DSN every operation opens the engine inside an exclusive `flock` on `<dir>.lock` and
closes it again (about 0.07 s per open once the engine is loaded). A server DSN keeps
one client for the life of the store and takes no lock.

The ledger consumer writes all day, and every chDB open/close leaks about 2.3 MB of
anonymous memory inside the engine (measured: 60 reopens, +115 MB RssAnon), so its store
is opened with `hold=True`: the engine and the lock stay open between sessions and are
let go only when another process asks for the ledger. A process waiting for the lock
holds a shared `flock` on `<dir>.want` meanwhile; the holder checks that file between
batches (`release_if_wanted`). The engine's caches, 5 GiB each by default, are capped
for an embedded ledger (`EMBEDDED_CACHE_LIMITS`; a DSN query parameter overrides one).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import parse_qsl, urlencode, urlsplit

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import OperationalError

from activities.decisions import Decision
from activities.events import LifecycleEvent
from contracts.redact import mask_credentials

TABLE = "lifecycle_events"

#: One column per LifecycleEvent field, in insert order. Kind and capacity type are
#: strings rather than Enums so that adding an EventKind never needs a migration.
EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("event_id", "UUID"),
    ("kind", "LowCardinality(String)"),
    ("occurred_at", "DateTime64(3, 'UTC')"),
    ("instance_id", "String"),
    ("region", "LowCardinality(String)"),
    ("pool_id", "LowCardinality(String)"),
    ("hall", "LowCardinality(String)"),
    ("sku", "LowCardinality(String)"),
    ("size", "LowCardinality(String)"),
    ("capacity_type", "LowCardinality(String)"),
    ("workload", "LowCardinality(String)"),
    ("tier", "UInt8"),
    ("price_per_hour", "Float64"),
    ("reason", "String"),
)
EVENT_COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _ in EVENT_COLUMNS)


# ReplacingMergeTree keyed by event_id collapses a replayed event into one row; merges are
# eventual, so every query reads with FINAL. Partitions are by month of occurrence: a
# replayed event has the same occurred_at, so its duplicates share a partition and still
# collapse. The bloom filter keeps instance_history from scanning every granule.
def _table(name: str, columns: Sequence[tuple[str, str]], index: str = "") -> str:
    """A ledger table's DDL: its columns, when the row was inserted, `index` if any."""
    ddl = "".join(f"    {column} {type_},\n" for column, type_ in columns)
    last = f",\n    {index}" if index else ""
    return f"""CREATE TABLE IF NOT EXISTS {name} (
{ddl}    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3){last}
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(occurred_at)
ORDER BY event_id
"""


_SCHEMA = _table(
    TABLE, EVENT_COLUMNS, "INDEX idx_instance_id instance_id TYPE bloom_filter GRANULARITY 4"
)

DECISIONS_TABLE = "decisions"
DECISION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("event_id", "UUID"),
    ("occurred_at", "DateTime64(3, 'UTC')"),
    ("region", "LowCardinality(String)"),
    ("kind", "LowCardinality(String)"),
    ("subject", "String"),
    ("outcome", "LowCardinality(String)"),
    ("actor", "String"),
    ("reason", "String"),
    ("amount_per_hour", "Float64"),
    ("units", "Int64"),
    ("workflow_id", "String"),
    ("identity", "String"),
)
DECISION_COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _ in DECISION_COLUMNS)
_ADDED_DECISION_COLUMNS = (("identity", "String"),)
# Same dedupe and partitioning as the lifecycle table: a replayed decision is one row.
_DECISIONS_SCHEMA = _table(DECISIONS_TABLE, DECISION_COLUMNS)

# Lost work per drained workload (activities/ledger/lost_work.py), here with the other
# tables so that every session ensures it: its readers' queries may be run by the ledger's
# holder, which runs nothing but the query (activities/ledger/holder.py).
LOST_WORK_TABLE = "lost_work"
LOST_WORK_COLUMNS = (
    ("event_id", "UUID"),
    ("occurred_at", "DateTime64(3, 'UTC')"),
    ("region", "LowCardinality(String)"),
    ("node", "String"),
    ("notice_id", "String"),
    ("workload", "LowCardinality(String)"),  # the contract, as in the lifecycle table
    ("job", "String"),  # the scheduler's id of the drained workload
    ("action", "LowCardinality(String)"),
    ("result", "LowCardinality(String)"),
    ("lost_steps", "Nullable(Int64)"),
    ("lost_tasks", "Nullable(Int64)"),
    ("lost_seconds", "Nullable(Float64)"),
)
_LOST_WORK_SCHEMA = _table(LOST_WORK_TABLE, LOST_WORK_COLUMNS)

#: Server settings of an embedded engine (chDB takes them as DSN query parameters): the
#: mark and index caches default to 5 GiB each, far past what a ledger of this size needs.
EMBEDDED_CACHE_LIMITS: dict[str, int] = {
    "mark_cache_size": 64 << 20,
    "index_mark_cache_size": 16 << 20,
    "primary_index_cache_size": 16 << 20,
    "query_condition_cache_size": 16 << 20,
}

_SERVER_SCHEMES = frozenset({"http", "https"})
_MEMORY_NETLOCS = frozenset({"memory", ":memory:"})


class LedgerUnavailable(RuntimeError):
    """The ledger cannot be opened or reached; `dsn` has any password masked."""

    def __init__(self, dsn: str, reason: str) -> None:
        self.dsn = mask_credentials(dsn)
        self.reason = reason
        super().__init__(f"ledger {self.dsn} unavailable: {reason}")


def as_utc(value: datetime) -> datetime:
    """`value` in UTC; a naive datetime is taken to be UTC already."""
    # clickhouse-connect reads a naive datetime as the host's local time on insert; SCO
    # treats naive as UTC, so make that explicit before it reaches the driver.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _event_row(event: LifecycleEvent) -> list[Any]:
    return [
        event.event_id,
        event.kind.value,
        as_utc(event.occurred_at),
        event.instance_id,
        event.region,
        event.pool_id,
        event.hall,
        event.sku,
        event.size,
        event.capacity_type.value,
        event.workload,
        event.tier,
        event.price_per_hour,
        event.reason,
    ]


class LedgerStore:
    """Lifecycle history and spend, stored in ClickHouse.

    `dsn` is `chdb:///abs/dir`, `chdb:relative/dir` (resolved against the current
    directory now), `chdb://memory` (this process only), or `http(s)://user:pw@host:port/db`.
    Run operations inside `with store.session() as client:`; sessions nest (an inner one
    reuses the outer client) and are serialised between threads.
    """

    def __init__(
        self,
        dsn: str,
        *,
        lock_timeout: float = 30.0,
        client_options: dict[str, Any] | None = None,
        hold: bool = False,
        reads_in_child: bool = False,
    ) -> None:
        """`client_options`: clickhouse-connect TLS and credential arguments for a server.
        `hold`: on chDB, keep the engine open between sessions until another process
        wants the ledger (the long-running writer; see the module docstring).
        `reads_in_child`: on an on-disk chDB ledger, the reads that support it
        (`reclaim_rate`) run in a short-lived child process (activities/ledger/child.py),
        so a long-running reader never loads the engine (~280 MB) nor leaks its reopens."""
        self.dsn = dsn
        self.hold = hold
        self.reads_in_child = reads_in_child
        self._held_lock: TextIO | None = None  # the flock'd handle while the engine is held
        self._client_options = dict(client_options or {})
        self.lock_timeout = lock_timeout
        parts = urlsplit(dsn)
        self._scheme = parts.scheme.lower()
        self._query = parts.query
        #: Data directory of an on-disk chDB ledger; None for servers and chdb memory.
        self.path: Path | None = None
        if self._scheme == "chdb":
            # chdb://memory[/db] is in-process only; anything else is a directory, and
            # chdb://a/b means the relative path a/b (netloc + path), not host a.
            location = parts.netloc + parts.path
            if location and parts.netloc not in _MEMORY_NETLOCS:
                self.path = Path(os.path.abspath(location))
        elif self._scheme not in _SERVER_SCHEMES:
            raise LedgerUnavailable(dsn, f"unsupported scheme {parts.scheme!r} (chdb, http, https)")
        self._mutex = threading.RLock()
        self._client: Client | None = None  # persistent (server, memory) or current session
        self._depth = 0
        self._schema_ready = False

    @property
    def lock_path(self) -> Path | None:
        """The lock file beside an on-disk chDB data directory."""
        return None if self.path is None else self.path.with_name(self.path.name + ".lock")

    def __enter__(self) -> LedgerStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def session(self) -> Iterator[Client]:
        """A client for a few operations; on chDB, holds the ledger for exactly that long."""
        if not self._mutex.acquire(timeout=self.lock_timeout):
            raise LedgerUnavailable(self.dsn, f"busy in this process for {self.lock_timeout} s")
        try:
            if self._depth > 0:
                assert self._client is not None
                self._depth += 1
                try:
                    yield self._client
                finally:
                    self._depth -= 1
                return
            if self.path is None:
                with self._persistent_session() as client:
                    yield client
            else:
                with self._embedded_session() as client:
                    yield client
        finally:
            self._mutex.release()

    @contextmanager
    def read_session(self) -> Iterator[Any]:
        """A client for queries only (its `query`). On an on-disk chDB ledger that this
        process does not hold, the process holding it (the ledger consumer) runs them
        (activities/ledger/holder.py), so a read does not take the ledger from it; when
        nobody holds it, or an answer is too big for the socket, a session as `session`."""
        if self.path is None or self.hold:
            with self.session() as client:
                yield client
            return
        from activities.ledger.holder import HeldReads

        with ExitStack() as own:
            yield HeldReads(self, lambda: own.enter_context(self.session()))

    @contextmanager
    def _persistent_session(self) -> Iterator[Client]:
        if self._client is None:
            self._client = self._open()
        self._depth = 1
        try:
            self._ensure_schema_once(self._client)
            yield self._client
        except OperationalError as exc:
            # The connection broke: drop the client so the next session reconnects.
            self._close_client()
            raise LedgerUnavailable(self.dsn, str(exc)) from exc
        finally:
            self._depth = 0

    @contextmanager
    def _embedded_session(self) -> Iterator[Client]:
        if self.hold:
            with self._held_session() as client:
                yield client
            return
        handle = self._take_file_lock()
        try:
            self._client = self._open()
            try:
                with self._session_on(self._client) as client:
                    yield client
            finally:
                # Closing releases the chDB directory for the next process.
                self._close_client()
        finally:
            handle.close()  # closing the descriptor releases the flock

    @contextmanager
    def _held_session(self) -> Iterator[Client]:
        if self._held_lock is None:
            handle = self._take_file_lock()
            try:
                self._client = self._open()
            except BaseException:
                handle.close()
                raise
            self._held_lock = handle
        assert self._client is not None
        with self._session_on(self._client) as client:
            yield client

    @contextmanager
    def _session_on(self, client: Client) -> Iterator[Client]:
        """One session on an open embedded client: the schema ensured once, `_depth` set
        while it lasts."""
        self._depth = 1
        try:
            self._ensure_schema_once(client)
            yield client
        finally:
            self._depth = 0

    @property
    def want_path(self) -> Path | None:
        """Where a process waiting for the ledger says so (a shared flock)."""
        return None if self.path is None else self.path.with_name(self.path.name + ".want")

    def release_if_wanted(self) -> bool:
        """A held engine is closed (and the lock let go) when another process waits for
        the ledger; True when it was. The next session opens it again."""
        if self._held_lock is None or self.want_path is None:
            return False
        if not self._mutex.acquire(blocking=False):
            return False  # a session of this process is under way; asked again next time
        try:
            if self._held_lock is None or self._depth > 0:
                return False
            try:
                with open(self.want_path, "a") as want:
                    try:
                        fcntl.flock(want, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        return False  # nobody waits (closing the file unlocks)
                    except BlockingIOError:
                        pass
            except OSError:
                return False
            self._release_held()
            return True
        finally:
            self._mutex.release()

    def _release_held(self) -> None:
        self._close_client()
        handle, self._held_lock = self._held_lock, None
        if handle is not None:
            handle.close()

    def _take_file_lock(self) -> TextIO:
        """The exclusive flock on `<dir>.lock` (an open handle: closing it unlocks), waited
        for at most `lock_timeout`, a shared flock on `<dir>.want` held while waiting."""
        assert self.path is not None and self.lock_path is not None
        assert self.want_path is not None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle: TextIO = open(self.lock_path, "a")  # noqa: SIM115 - returned locked
        except OSError as exc:
            raise LedgerUnavailable(self.dsn, f"cannot create {self.lock_path}: {exc}") from exc
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            pass
        except BaseException:
            handle.close()
            raise
        try:
            with open(self.want_path, "a") as want:
                fcntl.flock(want, fcntl.LOCK_SH)  # a holder keeping the engine lets it go
                # Poll with LOCK_NB so a stuck holder costs a bounded wait and a clear
                # error, not a hung CLI.
                deadline = time.monotonic() + self.lock_timeout
                while True:
                    try:
                        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        return handle
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            raise LedgerUnavailable(
                                self.dsn,
                                f"{self.lock_path} held by another process "
                                f"for {self.lock_timeout} s",
                            ) from None
                        time.sleep(0.02)
        except BaseException:
            handle.close()
            raise

    def _open(self) -> Client:
        kwargs: dict[str, Any] = {"tz_mode": "aware"}  # datetimes come back as UTC-aware
        if self.path is None and self._scheme in _SERVER_SCHEMES:
            kwargs.update(self._client_options)
        if self.path is not None:
            query, kwargs["chdb_options"] = _engine_options(self._query)
            dsn = f"chdb://{self.path}" + (f"?{query}" if query else "")
        else:
            dsn = self.dsn
            if self._scheme == "https":
                kwargs["secure"] = True  # the driver ignores the scheme otherwise
        try:
            return clickhouse_connect.get_client(dsn=dsn, **kwargs)
        except Exception as exc:
            raise LedgerUnavailable(self.dsn, str(exc)) from exc

    def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def _ensure_schema_once(self, client: Client) -> None:
        # Queries on a fresh ledger should see an empty table, not a missing one.
        if not self._schema_ready:
            client.command(_SCHEMA)
            client.command(_DECISIONS_SCHEMA)
            client.command(_LOST_WORK_SCHEMA)
            # Columns added after the table was first created, for ledgers made before.
            for name, type_ in _ADDED_DECISION_COLUMNS:
                client.command(
                    f"ALTER TABLE {DECISIONS_TABLE} ADD COLUMN IF NOT EXISTS {name} {type_}"
                )
            self._schema_ready = True

    def ensure_schema(self) -> None:
        """Create the table if it does not exist; safe to call any number of times."""
        with self.session() as client:
            client.command(_SCHEMA)
            client.command(_DECISIONS_SCHEMA)
            client.command(_LOST_WORK_SCHEMA)
            # Columns added after the table was first created, for ledgers made before.
            for name, type_ in _ADDED_DECISION_COLUMNS:
                client.command(
                    f"ALTER TABLE {DECISIONS_TABLE} ADD COLUMN IF NOT EXISTS {name} {type_}"
                )
            self._schema_ready = True

    def insert_events(self, events: Sequence[LifecycleEvent]) -> int:
        """Insert a batch; re-inserting events (a topic replay) never double-counts."""
        if not events:
            return 0
        rows = [_event_row(event) for event in events]
        with self.session() as client:
            client.insert(TABLE, rows, column_names=list(EVENT_COLUMN_NAMES))
        return len(rows)

    def insert_decisions(self, decisions: Sequence[Decision]) -> int:
        """Insert a batch of decisions; a replay never duplicates one."""
        if not decisions:
            return 0
        rows = [[getattr(d, name) for name in DECISION_COLUMN_NAMES] for d in decisions]
        for row in rows:
            row[1] = as_utc(row[1])
            row[3] = str(row[3])
        with self.session() as client:
            client.insert(DECISIONS_TABLE, rows, column_names=list(DECISION_COLUMN_NAMES))
        return len(rows)

    def close(self) -> None:
        """Release the persistent client (server DSNs) or the held engine and its lock."""
        with self._mutex:
            if self._depth == 0:
                self._release_held()


def _engine_options(query: str) -> tuple[str, dict[str, str]]:
    """The DSN's query split into what stays in the DSN and the engine's options: the
    cache limits, each overridden by a DSN parameter of the same name."""
    params = parse_qsl(query, keep_blank_values=True)
    engine = {name: str(value) for name, value in EMBEDDED_CACHE_LIMITS.items()}
    engine.update((k, v) for k, v in params if k in EMBEDDED_CACHE_LIMITS)
    rest = [(k, v) for k, v in params if k not in EMBEDDED_CACHE_LIMITS]
    return urlencode(rest), engine
