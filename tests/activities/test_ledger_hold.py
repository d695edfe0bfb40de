"""A held embedded ledger (the consumer's: the chDB engine stays open between batches,
since every reopen leaks inside the engine) still lets another process in: a reader
waiting for the lock says so, the holder lets go between batches, and opens again."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

from activities.events import LifecycleEvent
from activities.ledger.store import EMBEDDED_CACHE_LIMITS, TABLE, LedgerStore
from tests.support.ledger_events import cpu_event
from tests.support.ledger_reader import read_elsewhere


def events(n: int) -> list[LifecycleEvent]:
    return [cpu_event(f"hold-{uuid.uuid4().hex[:8]}") for _ in range(n)]


def test_a_held_ledger_lets_a_waiting_reader_in_and_opens_again(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path / 'ledger'}"
    store = LedgerStore(dsn, hold=True)
    try:
        store.insert_events(events(5))
        assert not store.release_if_wanted()  # nobody waits: the engine stays open
        stop = threading.Event()

        def between_batches() -> None:  # the consumer's loop, without Kafka
            while not stop.is_set():
                store.release_if_wanted()
                # sleep is the behaviour under test: the consumer's pace between batches
                time.sleep(0.1)

        loop = threading.Thread(target=between_batches, daemon=True)
        loop.start()
        started = time.monotonic()
        out = read_elsewhere(
            dsn,
            f"SELECT count() FROM {TABLE} FINAL",
            "SELECT value FROM system.server_settings WHERE name = 'mark_cache_size'",
        )
        stop.set()
        loop.join(timeout=10)
        print(f"reader answered in {time.monotonic() - started:.1f} s")
        assert out == ["5", str(EMBEDDED_CACHE_LIMITS["mark_cache_size"])]
        # The holder opens it again for the next batch.
        store.insert_events(events(3))
        with store.session() as client:
            assert client.query(f"SELECT count() FROM {TABLE} FINAL").result_rows[0][0] == 8
    finally:
        store.close()
