"""The ledger consumer's memory cap (`ledger.recycle_rss_mb`): over it, and past its first
minute, the consumer restarts itself; never for a ClickHouse server ledger, never at 0.
The restart itself (exec, same pid, nothing lost) runs in bench/ledger_soak_bench.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.ledger_consumer import service as ledger_consumer
from workers.settings import LedgerSettings, Settings


def over(cap: int, path: Path | None) -> Any:
    settings = Settings(ledger=LedgerSettings(recycle_rss_mb=cap))
    return ledger_consumer._over(settings, SimpleNamespace(path=path))  # type: ignore[arg-type]


def test_over_the_cap_after_the_first_minute_it_restarts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert ledger_consumer.rss_mb() > 1  # this process's VmRSS, from /proc
    monkeypatch.setattr(ledger_consumer, "MIN_UPTIME_S", 0.0)
    assert over(1, tmp_path)()
    assert not over(1_000_000, tmp_path)()


def test_within_its_first_minute_it_never_restarts(tmp_path: Path) -> None:
    assert not over(1, tmp_path)()


def test_off_at_zero_and_for_a_server_ledger(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(ledger_consumer, "MIN_UPTIME_S", 0.0)
    assert not over(0, tmp_path)()
    assert not over(1, None)()
