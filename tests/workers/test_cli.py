"""The `sco` command's error paths: a clear one-line error and a non-zero exit."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from activities.events import CapacityType, EventKind
from activities.fleet.repository import FleetRepository, InstanceSpec
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


def test_contracts_keygen_compile_verify_round_trip(tmp_path: Path) -> None:
    from tests.support.contract_fixtures import EXAMPLES
    from tests.support.paths import REGIONS_DIR

    assert runner.invoke(app, ["contracts", "keygen", "--out", str(tmp_path / "k")]).exit_code == 0
    key = next((tmp_path / "k").glob("*.key"))
    out = tmp_path / "bundle.json"
    compiled = runner.invoke(
        app,
        [
            "contracts",
            "compile",
            str(EXAMPLES),
            "--regions",
            str(REGIONS_DIR),
            "--key",
            str(key),
            "--out",
            str(out),
            "--without-notice-keys",
        ],
    )
    assert compiled.exit_code == 0, compiled.output
    assert "serial 1, 4 contracts" in compiled.output
    ok = runner.invoke(app, ["contracts", "verify", str(out), "--trust", str(tmp_path / "k")])
    assert ok.exit_code == 0 and ok.output.startswith("OK serial 1")
    out.write_bytes(out.read_bytes().replace(b'"tier":3', b'"tier":1'))
    refused = runner.invoke(app, ["contracts", "verify", str(out), "--trust", str(tmp_path / "k")])
    assert refused.exit_code == 1 and "REFUSED: bad signature" in refused.output


def test_contracts_compile_reports_errors_and_writes_nothing(tmp_path: Path) -> None:
    from tests.support.paths import REGIONS_DIR

    runner.invoke(app, ["contracts", "keygen", "--out", str(tmp_path / "k")])
    key = next((tmp_path / "k").glob("*.key"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.yaml").write_text("name: a\ntier: 9\n")
    out = tmp_path / "bundle.json"
    result = runner.invoke(
        app,
        [
            "contracts",
            "compile",
            str(src),
            "--regions",
            str(REGIONS_DIR),
            "--key",
            str(key),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 1
    assert f"{src}/a.yaml:2: tier: Input should be less than or equal to 3" in result.output
    assert "no bundle written" in result.output and not out.exists()


def _committed(fleet: FleetRepository, instance_id: str, pool_id: str) -> None:
    fleet.record_acquire(
        InstanceSpec(
            instance_id=instance_id,
            region="r1",
            pool_id=pool_id,
            capacity_type=CapacityType.COMMITTED,
            workload="llm-train",
            tier=1,
            acquisition_id=f"floor-r1-llm-train-A-1-{instance_id[-6:]}",
        )
    )
    fleet.record_event(instance_id, EventKind.READY, provider_id=f"p-{instance_id}")


def test_reclaim_refuses_committed_floor_instances_without_force(
    pg_dsn: str, fleet_repo: FleetRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tried as an operator would: `sco reclaim` on a floor's instance is refused (its
    floor would drop until rebuilt); --force goes on to the relay."""
    monkeypatch.setenv("SCO_POSTGRES_DSN", pg_dsn)
    name = f"floor-r1-llm-train-A-1-{uuid.uuid4().hex[:6]}-0000"
    _committed(fleet_repo, name, "r1.A.gpu-a.xl")
    result = runner.invoke(app, ["reclaim", name, "--region", "r1"])
    assert result.exit_code == 1
    assert "committed capacity (llm-train via floor-r1-llm-train-A-1-" in result.output
    assert "refused without --force" in result.output
    result = runner.invoke(app, ["reclaim", "r1.A.gpu-a.xl", "--pool", "--region", "r1"])
    assert result.exit_code == 1 and "committed instance(s)" in result.output
    result = runner.invoke(app, ["reclaim", name, "--region", "r1", "--force"])
    # Past the guard: on to the hall's relay (none runs here, so that is the error).
    assert "refused" not in result.output and "committed" not in result.output
