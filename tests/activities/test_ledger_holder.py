"""The process holding an embedded ledger answers reclaim-rate reads on its socket, so a
reader (the region worker) never makes it let the ledger go; a reader starts a child only
when nobody listens; the socket refuses what is not a request, in one line, and keeps
answering."""

from __future__ import annotations

import json
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.events import EventKind
from activities.ledger import LedgerStore, LedgerUnavailable, reclaim_rate
from activities.ledger.child import MAX_MESSAGE_BYTES
from activities.ledger.holder import HolderSocket, socket_path
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
    assert reads.answered == {"rates": 3, "drain": 0}
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
        (_request(op="drop"), "request: op 'drop' is neither rates nor drain"),
        (
            b'{"op": "drain", "event": [], "region": "r1", "node": "n1"}',
            "request: event must be an object, region and node strings",
        ),
        (b'{"op": "drain", "event": {}}', "request: field 'region' missing"),
        (_request(pools="r1-A-c5-xl"), "request: pools is str, not a list"),
        (_request(start=None), "request: field 'start' missing"),
        (_request(end="yesterday"), "request: Invalid isoformat string: 'yesterday'"),
        (b"[1, 2]", "request: a list, not an object"),
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
    assert said in str(answer["unavailable"]) and "\n" not in str(answer["unavailable"])
    # Nothing was answered, and the next reader is.
    assert reads.answered == {"rates": 0, "drain": 0}
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
    assert reads.answered == {"rates": 0, "drain": 0}
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
