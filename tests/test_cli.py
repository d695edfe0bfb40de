"""The `sco` command's error paths: a clear one-line error and a non-zero exit."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from workers.cli.main import app

runner = CliRunner()


def test_ledger_spend_rejects_an_unknown_group_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCO_DATA_DIR", str(tmp_path))
    result = runner.invoke(app, ["ledger", "spend", "--by", "colour"])
    assert result.exit_code == 1
    assert "--by colour: not a ledger key" in result.output


def test_ledger_spend_rejects_a_bad_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCO_DATA_DIR", str(tmp_path))
    result = runner.invoke(app, ["ledger", "spend", "--window", "yesterday"])
    assert result.exit_code == 2
    assert "expected a number and a unit" in result.output


def test_ledger_spend_on_an_empty_ledger_prints_an_empty_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCO_DATA_DIR", str(tmp_path))
    result = runner.invoke(app, ["ledger", "spend", "--json"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "[]"


def test_bad_settings_stop_every_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCO_KAFKA__PARTITIONS", "many")
    result = runner.invoke(app, ["dev", "status"])
    assert result.exit_code == 1
    assert "kafka.partitions" in result.output


def test_db_migrate_against_a_dead_server_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "SCO_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:1/sco?connect_timeout=2"
    )
    result = runner.invoke(app, ["db", "migrate"])
    assert result.exit_code == 1
    assert result.output.startswith("error: ")
