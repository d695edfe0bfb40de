"""A box process that dies while starting says why in the error, from its own log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from workers.devbox import process
from workers.devbox.process import DevboxError


def test_a_process_that_exits_during_start_is_named_with_its_last_words(tmp_path: Path) -> None:
    log = tmp_path / "sim.log"
    record = process.start(
        [sys.executable, "-c", "import sys; print('starting'); sys.exit('port 30005 in use')"],
        log,
    )
    with pytest.raises(DevboxError) as raised:
        process.wait_until("sim-r1", lambda: False, timeout=30, record=record)
    assert str(raised.value) == (
        f"sim-r1: process exited during start (port 30005 in use); see {log}"
    )


def test_the_last_line_is_read_from_the_end_of_a_long_log_only(tmp_path: Path) -> None:
    log = tmp_path / "long.log"
    log.write_text("x" * 100_000 + "\nthe end\n\n")
    assert process.last_log_line(log) == "the end"
    assert process.last_log_line(tmp_path / "missing.log") == ""
    (tmp_path / "long-line.log").write_text("y" * 1000)
    assert process.last_log_line(tmp_path / "long-line.log") == "y" * 300
