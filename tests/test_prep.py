"""tests/support/prep.py: a test that needs the test cloud or the image waits for `make
test`'s background preparation, and a failed one is named with its log."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.support import prep


def test_without_a_prep_dir_nothing_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(prep.PREP_DIR_ENV, raising=False)
    prep.await_prep("testcloud")
    assert prep.outcome("testcloud") is None


def test_a_preparation_not_started_is_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(prep.PREP_DIR_ENV, str(tmp_path))
    prep.await_prep("image")  # TESTCLOUD=0 or no podman: no log, nothing to wait for
    assert prep.outcome("image") is None


def test_a_running_preparation_is_waited_for_until_its_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(prep.PREP_DIR_ENV, str(tmp_path))
    (tmp_path / "testcloud.log").write_text("installing OpenStack\n")
    done = threading.Timer(0.5, (tmp_path / "testcloud.rc").write_text, args=("0\n",))
    done.start()
    started = time.monotonic()
    prep.await_prep("testcloud")
    assert time.monotonic() - started >= 0.4
    assert prep.outcome("testcloud") is None


def test_a_failed_preparation_names_its_exit_code_and_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(prep.PREP_DIR_ENV, str(tmp_path))
    (tmp_path / "testcloud.log").write_text("a\nb\ntestcloud: error: port 5000 is in use\n")
    (tmp_path / "testcloud.rc").write_text("1\n")
    why = prep.outcome("testcloud")
    assert why is not None
    assert "exit 1" in why and "testcloud.log" in why and "port 5000 is in use" in why
