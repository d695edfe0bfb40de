"""`sco contracts` commands that talk to NATS, with none answering: each fails in one line
saying what it was doing (workers/cli/contracts.py `_on_nats`), never with a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contracts import keys
from tests.support.paths import REGIONS_DIR
from tests.support.services import free_port
from workers.cli.main import app

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("argv", "doing"),
    [
        (["contracts", "pull"], "pulling from {url} for r1: "),
        (["contracts", "status"], "reading {url} for r1: "),
        (
            [
                "contracts",
                "reset-serial",
                "--region",
                "r1",
                "--to",
                "3",
                "--publish",
                "--reason",
                "t",
            ],
            "publishing to {url} for r1: ",
        ),
    ],
    ids=["pull", "status", "reset-serial"],
)
def test_a_nats_command_without_nats_says_what_failed(
    tmp_path: Path, argv: list[str], doing: str
) -> None:
    _, private, public = keys.generate(tmp_path / "keys")
    trust = tmp_path / "trust"
    trust.mkdir()
    shutil.copy(public, trust / public.name)
    if argv[1] == "reset-serial":
        argv = [*argv, "--key", str(private), "--out", str(tmp_path / "reset.json")]
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    env = {
        "SCO_NATS_URL": url,
        "SCO_REGION": "r1",
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_DATA_DIR": str(tmp_path / "data"),
        "SCO_CONTRACTS__TRUST_DIR": str(trust),
        "COLUMNS": "400",
    }
    res = CliRunner().invoke(app, argv, env=env)
    assert res.exit_code == 1, res.output
    assert f"error: {doing.format(url=url)}" in res.output, res.output


def test_a_serial_reset_without_a_reason_is_refused_in_one_line(tmp_path: Path) -> None:
    """It crashed with a ValidationError: the signed reset's reason is a string."""
    _, private, _ = keys.generate(tmp_path / "keys")
    out = tmp_path / "reset.json"
    res = CliRunner().invoke(
        app,
        [
            *("contracts", "reset-serial", "--region", "r1", "--to", "3"),
            *("--key", str(private), "--out", str(out)),
        ],
        env={"SCO_REGIONS_DIR": str(REGIONS_DIR), "SCO_DATA_DIR": str(tmp_path / "data")},
    )
    assert res.exit_code in (1, 2), res.output
    assert "--reason: required" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1 and not out.exists()
