"""The controller's reclaim rates: read from the ledger at most every few minutes, the
first read waited for, later ones beside the ticks (an embedded ledger is read by a child
process, seconds on a loaded machine: decision 0037), never two reads at once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from activities.control import activities as control
from activities.control.activities import ControlActivities
from activities.ledger.store import LedgerStore, LedgerUnavailable
from contracts.region import load_region
from tests.support.control_activities import bare_control
from tests.support.paths import REGIONS_DIR


class _Ledger:
    """Stands in for queries.reclaim_rate: each read answers the next rate, once let go."""

    def __init__(self) -> None:
        self.reads = 0
        self.go = threading.Event()
        self.go.set()
        self.rate = 0.0

    def __call__(self, store: Any, *, pool_ids: list[str], **_: Any) -> dict[str, float]:
        self.reads += 1
        self.go.wait(10)
        self.rate += 0.1
        if self.rate > 0.25 and self.rate < 0.35:
            raise LedgerUnavailable("chdb:///x", "held by another process for 2 s")
        return dict.fromkeys(pool_ids, round(self.rate, 1))


@pytest.fixture
def ledger(monkeypatch: pytest.MonkeyPatch) -> _Ledger:
    fake = _Ledger()
    monkeypatch.setattr(control, "reclaim_rate", fake)
    return fake


def _activities(tmp_path: Path) -> ControlActivities:
    return bare_control(
        tmp_path, ledger=LedgerStore(f"chdb://{tmp_path}/ledger", reads_in_child=True)
    )


def _wait_for(cond: Any) -> None:
    for _ in range(500):
        if cond():
            return
        threading.Event().wait(0.01)
    raise AssertionError("not within 5 s")


def test_rates_are_read_once_then_refreshed_beside_the_ticks(
    ledger: _Ledger, tmp_path: Path
) -> None:
    region = load_region(REGIONS_DIR / "r1.toml")
    acts = _activities(tmp_path)
    pool = region.pool_ids()[0]
    # The four partitions' first ticks at once: one read, every tick plans with it.
    ledger.go.clear()
    with ThreadPoolExecutor(4) as pool_of_ticks:
        firsts = [pool_of_ticks.submit(acts._reclaim_rates, region, 24.0) for _ in range(4)]
        _wait_for(lambda: ledger.reads == 1)
        ledger.go.set()
        assert [f.result()[pool] for f in firsts] == [0.1] * 4
    assert ledger.reads == 1
    assert acts._reclaim_rates(region, 24.0)[pool] == 0.1  # fresh: no read
    assert ledger.reads == 1
    # Stale: the tick plans with the last rates while one refresh runs beside it.
    acts._rates_at -= control._RATE_CACHE_SECONDS + 1
    ledger.go.clear()
    assert acts._reclaim_rates(region, 24.0)[pool] == 0.1
    assert acts._reclaim_rates(region, 24.0)[pool] == 0.1
    _wait_for(lambda: ledger.reads == 2)
    ledger.go.set()
    _wait_for(lambda: acts._reclaim_rates(region, 24.0)[pool] == 0.2)
    assert ledger.reads == 2
    # A ledger that cannot be read: the last rates stay, and are not asked for again
    # until the cache time has passed.
    acts._rates_at -= control._RATE_CACHE_SECONDS + 1
    acts._reclaim_rates(region, 24.0)
    _wait_for(lambda: ledger.reads == 3 and not acts._refreshing)
    assert acts._reclaim_rates(region, 24.0)[pool] == 0.2
    assert ledger.reads == 3
