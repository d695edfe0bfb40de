"""The process holding an embedded ledger answers reclaim-rate reads on its socket, so a
reader (the region worker) never makes it let the ledger go; a reader starts a child only
when nobody listens; the socket refuses what is not a request, in one line, and keeps
answering."""

from __future__ import annotations

import json
import math
import socket
import stat
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from activities.events import EventKind
from activities.ledger import LedgerStore, LedgerUnavailable, reclaim_rate
from activities.ledger import holder as holder_module
from activities.ledger.child import MAX_MESSAGE_BYTES
from activities.ledger.holder import HolderSocket, socket_path
from activities.ledger.lost_work import lost_work
from activities.ledger.queries import instance_history, reclaims_per_pool, spend
from activities.ledger.wire import tagged, untagged
from contracts.bounded import loads
from tests.activities.test_ledger import FLEET, T0, at, ev, lifecycle

pytestmark = pytest.mark.timeout(120)

POOLS = ["r1-B-g4-2xl", "r1-A-c5-xl", "r1-C-m5-l", "nowhere"]


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[LedgerStore, HolderSocket]]:
    (tmp_path / "data").mkdir(mode=0o750)
    store = LedgerStore(f"chdb://{tmp_path}/data/ledger", hold=True)
    b = {"pool_id": "r1-B-g4-2xl"}
    store.insert_events([*FLEET, *lifecycle("b1", 0, 2, **b), ev(EventKind.NOTICE, "b1", 1.0, **b)])
    reads = HolderSocket(store)
    assert reads.start()
    try:
        yield store, reads
    finally:
        reads.close()
        store.close()


def _ask(path: Path, payload: bytes) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        # The holder's answer, read within the bounds its readers use.
        raw = sock.makefile("rb").read(MAX_MESSAGE_BYTES + 1)
        answer: dict[str, object] = loads(raw, what="answer", max_bytes=MAX_MESSAGE_BYTES)
        return answer


def _request(**fields: object) -> bytes:
    doc = {"pools": POOLS, "start": T0.isoformat(), "end": at(4).isoformat(), **fields}
    return json.dumps({k: v for k, v in doc.items() if v is not None}).encode()


def test_the_holder_answers_the_rates_and_keeps_the_ledger(
    holder: tuple[LedgerStore, HolderSocket],
) -> None:
    store, reads = holder
    here = reclaim_rate(store, pool_ids=POOLS, start=T0, end=at(4))
    assert here["r1-B-g4-2xl"] > 0
    # A short lock wait: a child could read only if the holder let the ledger go.
    reader = LedgerStore(store.dsn, lock_timeout=0.5, reads_in_child=True)
    for _ in range(3):
        assert reclaim_rate(reader, pool_ids=POOLS, start=T0, end=at(4)) == pytest.approx(here)
    assert reads.answered == {"rates": 3, "drain": 0, "query": 0}
    assert store._held_lock is not None, "the holder kept the ledger open"
    assert reader._client is None
    # The socket is as private as the ledger's directory (rwxr-x---): owner and group.
    path = socket_path(store)
    assert path is not None and stat.S_IMODE(path.stat().st_mode) == 0o660


def test_without_a_listening_holder_a_reader_starts_a_child(tmp_path: Path) -> None:
    store = LedgerStore(f"chdb://{tmp_path}/ledger")
    store.insert_events(FLEET)
    here = reclaim_rate(store, pool_ids=POOLS, start=T0, end=at(4))
    store.close()
    # The socket of a holder that died: there, but nobody listens.
    path = socket_path(store)
    assert path is not None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))
    reader = LedgerStore(store.dsn, lock_timeout=30, reads_in_child=True)
    assert reclaim_rate(reader, pool_ids=POOLS, start=T0, end=at(4)) == pytest.approx(here)


@pytest.mark.parametrize(
    ("payload", "said"),
    [
        (b"not json", "request: "),
        (b'{"pools": ' + b"[" * 9 + b"]" * 9 + b"}", "request: nested 10 deep > 9"),
        (_request(pools=[["r1-A-c5-xl"]]), "request: pools: every pool id must be a string"),
        (_request(op="drop"), "request: op 'drop' is not rates, drain or query"),
        (
            b'{"op": "drain", "event": [], "region": "r1", "node": "n1"}',
            "request: event must be an object, region and node strings",
        ),
        (b'{"op": "drain", "event": {}}', "request: field 'region' missing"),
        (_request(pools="r1-A-c5-xl"), "request: pools is str, not a list"),
        (_request(start=None), "request: field 'start' missing"),
        (_request(end="yesterday"), "request: Invalid isoformat string: 'yesterday'"),
        (b"[1, 2]", "request: a list, not an object"),
        (b'{"op": "query"}', "request: field 'sql' missing"),
        (b'{"op": "query", "sql": ["SELECT 1"]}', "request: sql must be a string, parameters"),
        (b'{"op": "query", "sql": "' + b"x" * 65537 + b'"}', "request: sql of 65537 characters"),
        (
            b'{"op": "query", "sql": "SELECT 1", "parameters": {"t": {"$uuid": 7}}}',
            "request: $uuid: int, not a string",
        ),
        (
            b'{"op": "query", "sql": "SELECT 1", "parameters": {"d": {"$decimal": "many"}}}',
            "request: $decimal: 'many' is not a number",
        ),
        (
            b'{"op": "query", "sql": "SELECT {t:DateTime}", "parameters": {"t": {"$date": "x"}}}',
            "request: Invalid isoformat string: 'x'",
        ),
    ],
    ids=[
        "garbage",
        "deep",
        "pool-ids",
        "op",
        "drain-event",
        "drain-region",
        "pools",
        "missing",
        "date",
        "list",
        "query-sql",
        "query-sql-type",
        "query-long",
        "query-tag",
        "query-decimal",
        "query-date",
    ],
)
def test_the_holder_refuses_what_is_not_a_request_in_one_line(
    holder: tuple[LedgerStore, HolderSocket], payload: bytes, said: str
) -> None:
    store, reads = holder
    path = socket_path(store)
    assert path is not None
    answer = _ask(path, payload)
    assert set(answer) == {"unavailable"}
    said_there = str(answer["unavailable"])
    assert said_there.startswith(said) and "\n" not in said_there
    assert "request: request" not in said_there
    # Nothing was answered, and the next reader is.
    assert reads.answered == {"rates": 0, "drain": 0, "query": 0}
    assert set(_ask(path, _request())) == {"rates"}


def test_an_oversized_request_is_cut_and_the_holder_keeps_answering(
    holder: tuple[LedgerStore, HolderSocket],
) -> None:
    """The holder reads at most 4 MiB and 1 byte of a request: a larger one is refused, or,
    when the sender is still sending as the holder closes, cut."""
    store, reads = holder
    path = socket_path(store)
    assert path is not None
    try:
        answer = _ask(path, b"x" * (5 << 20))
        assert "request: 4194305 bytes (at most 4194304)" in str(answer["unavailable"])
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert reads.answered == {"rates": 0, "drain": 0, "query": 0}
    assert set(_ask(path, _request())) == {"rates"}


def test_a_silent_connection_holds_up_no_other_reader(
    holder: tuple[LedgerStore, HolderSocket],
) -> None:
    store, _ = holder
    path = socket_path(store)
    assert path is not None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.connect(str(path))  # and says nothing
        reader = LedgerStore(store.dsn, lock_timeout=0.5, reads_in_child=True)
        assert reclaim_rate(reader, pool_ids=POOLS, start=T0, end=at(4))["r1-B-g4-2xl"] > 0


def test_a_holder_that_cannot_read_is_a_clear_error(
    holder: tuple[LedgerStore, HolderSocket],
) -> None:
    """A holder that answers it cannot read: the reader says so, and starts no child
    (which would have to take the ledger from the holder)."""
    store, reads = holder
    reads._store = LedgerStore("chdb://memory", lock_timeout=0.5)  # a ledger without the table
    reader = LedgerStore(store.dsn, lock_timeout=0.5, reads_in_child=True)
    with pytest.raises(LedgerUnavailable, match=r"the ledger's holder: "):
        reclaim_rate(reader, pool_ids=POOLS, start=T0, end=at(4))


def test_a_holder_listening_before_it_opens_the_ledger_answers_and_keeps_it(
    tmp_path: Path,
) -> None:
    """The consumer listens before its first session (a worker's read at the box's start):
    that read is answered by opening the holder's own store, and the ledger is never let go."""
    seeded = LedgerStore(f"chdb://{tmp_path}/ledger")
    seeded.insert_events(FLEET)
    here = reclaim_rate(seeded, pool_ids=POOLS, start=T0, end=at(4))
    seeded.close()
    store = LedgerStore(seeded.dsn, hold=True)
    reads = HolderSocket(store)
    try:
        assert reads.start(take_over=False)
        assert store._held_lock is None  # nothing opened yet
        reader = LedgerStore(store.dsn, lock_timeout=0.5, reads_in_child=True)
        assert reclaim_rate(reader, pool_ids=POOLS, start=T0, end=at(4)) == pytest.approx(here)
        assert reads.answered["rates"] == 1 and store._held_lock is not None
        assert reader._client is None
    finally:
        reads.close()
        store.close()


def test_a_second_holder_leaves_a_running_holders_socket_until_it_holds_the_ledger(
    holder: tuple[LedgerStore, HolderSocket],
) -> None:
    store, first = holder
    second = HolderSocket(LedgerStore(store.dsn, hold=True))
    assert not second.start(take_over=False)  # the first still answers there
    answer = _ask(socket_path(store) or Path("/"), _request())
    assert "rates" in answer and first.answered["rates"] == 1


def test_the_ledgers_readers_queries_are_run_by_the_holder_which_keeps_the_ledger(
    holder: tuple[LedgerStore, HolderSocket],
) -> None:
    """`sco ledger spend|reclaims|decisions|lost-work`, `sco why` and the console read
    through `read_session`: the holder runs each query and the rows are those read in
    place, datetimes, UUIDs and all; the reader never opens the ledger."""
    store, reads = holder

    def read(store: LedgerStore) -> tuple[list[Any], ...]:
        start, end = T0, at(4)
        return (
            spend(store, start=start, end=end, group_by=("workload", "pool_id")),
            reclaims_per_pool(store, start=start, end=end),
            instance_history(store, "b1"),
            lost_work(store, start=start, end=end),
        )

    here = read(store)
    reader = LedgerStore(store.dsn, lock_timeout=0.5)
    there = read(reader)
    assert there == here and here[1] and here[2], "the same, non-empty, rows"
    assert isinstance(there[2][0].event_id, uuid.UUID)
    assert reads.answered["query"] == 4 and store._held_lock is not None
    assert reader._client is None, "the reader never opened the ledger"


def test_a_query_that_writes_is_refused_by_the_engine_and_changes_nothing(
    holder: tuple[LedgerStore, HolderSocket],
) -> None:
    store, reads = holder
    path = socket_path(store) or Path("/")
    assert reads.answered["query"] == 0
    for sql in ("DROP TABLE lifecycle_events", "INSERT INTO decisions (kind) VALUES ('x')"):
        answer = _ask(path, json.dumps({"op": "query", "sql": sql}).encode())
        assert "readonly" in str(answer["unavailable"]).lower(), answer
    reader = LedgerStore(store.dsn, lock_timeout=0.5)
    assert instance_history(reader, "b1"), "the table is still there"
    # Through the store's reads, the refusal is the ledger's error with the engine's reason.
    with pytest.raises(LedgerUnavailable, match="READONLY"), reader.read_session() as client:
        client.query("DROP TABLE lifecycle_events")


def test_an_answer_too_big_for_the_socket_is_read_by_the_asker_itself(
    holder: tuple[LedgerStore, HolderSocket], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, reads = holder
    here = instance_history(store, "b1")
    monkeypatch.setattr(holder_module, "MAX_ROWS_BYTES", 200)
    # The consumer's loop, between its batches: the ledger goes to a process waiting for it.
    stop = threading.Event()

    def between_batches() -> None:
        while not stop.wait(0.1):
            store.release_if_wanted()

    batches = threading.Thread(target=between_batches)
    batches.start()
    reader = LedgerStore(store.dsn, lock_timeout=30)
    try:
        assert instance_history(reader, "b1") == here
    finally:
        reader.close()
        stop.set()
        batches.join()
    assert reads.answered["query"] == 1, "asked, answered too big, then read in place"


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 12, 7, 10, 0, 0, 123000, tzinfo=UTC),
        date(2026, 12, 7),
        uuid.UUID(int=7),
        Decimal("1.50"),
        math.inf,
        -math.inf,
        [1, "a", None, 2.5, True],
        {"k": [datetime(2026, 1, 1, tzinfo=UTC)], "n": {"$other": 1}},
    ],
    ids=["datetime", "date", "uuid", "decimal", "inf", "-inf", "plain", "nested"],
)
def test_query_values_cross_the_socket_as_they_are(value: object) -> None:
    raw = json.dumps(tagged(value)).encode()
    assert untagged(loads(raw, what="rows", max_bytes=MAX_MESSAGE_BYTES)) == value


def test_nan_crosses_as_nan_and_a_bad_tag_is_a_value_error() -> None:
    assert math.isnan(
        untagged(loads(json.dumps(tagged(math.nan)).encode(), what="r", max_bytes=99))
    )
    with pytest.raises(ValueError, match=r"\$float: 'lots'"):
        untagged({"$float": "lots"})
    with pytest.raises(ValueError, match=r"\$uuid: int, not a string"):
        untagged({"$uuid": 7})
    with pytest.raises(ValueError, match=r"\$decimal: 'many' is not a number"):
        untagged({"$decimal": "many"})
