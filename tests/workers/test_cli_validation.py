"""What the operator types is checked where they type it: exit status and one line."""

from __future__ import annotations

import os
import time
import uuid

import pytest
from temporalio.client import Client
from typer.testing import CliRunner

from tests.support import services
from tests.support.paths import REGIONS_DIR, REPO
from workers.cli.main import COMMANDS, app
from workflows.exclusion.models import exclusion_workflow_id

runner = CliRunner()


@pytest.fixture(autouse=True)
def regions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCO_REGIONS_DIR", str(REGIONS_DIR))


def error_line(output: str) -> str:
    lines = [x for x in output.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, output
    return lines[0]


def test_a_hall_the_region_does_not_have_is_refused() -> None:
    result = runner.invoke(app, ["hall", "lost", "r1", "Z", "--by", "op", "--reason", "test"])
    assert result.exit_code == 1
    assert error_line(result.output) == "error: region r1 has no hall Z (halls: A, B, C, D)"


@pytest.mark.parametrize(
    "argv",
    [
        ["acquisitions", "list", "--region", "r9"],
        ["controller", "status", "--region", "r9"],
        ["budget", "status", "--region", "r9"],
        ["demand", "list", "--region", "r9"],
        ["hall", "lost", "r9", "A", "--by", "op", "--reason", "test"],
    ],
)
def test_an_unknown_region_is_named_with_the_known_ones(argv: list[str]) -> None:
    result = runner.invoke(app, argv)
    assert result.exit_code == 1
    assert error_line(result.output) == "error: unknown region r9 (known: r1, r2, r3)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["demand", "set", "ci-runners", "-5"],
            "Invalid value for 'units': Input should be greater than or equal to 0",
        ),
        (
            ["budget", "set-rate", "-1", "0"],
            "Invalid value for 'rate': Input should be greater than or equal to 0",
        ),
    ],
)
def test_a_negative_number_gets_the_range_check_not_no_such_option(
    argv: list[str], message: str
) -> None:
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert message in result.output and "No such option" not in result.output


def test_postgresql_down_is_one_line_within_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCO_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:1/sco")
    start = time.monotonic()
    result = runner.invoke(app, ["demand", "list", "--region", "r1"])
    assert time.monotonic() - start < 5
    assert result.exit_code == 1
    assert error_line(result.output).startswith("error: PostgreSQL at 127.0.0.1:1 does not answer:")


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("sco ")


def test_help_lines_match_the_commands_they_stand_for() -> None:
    """`sco --help` lists lazily loaded commands from main.COMMANDS; each line must be the
    start of the command's own help."""
    for name, lazy in COMMANDS.items():
        help_text = " ".join((lazy.load(name).help or "").split())
        assert help_text.startswith(lazy.help), (name, help_text)


async def test_status_of_a_pool_that_never_had_a_notice(region_client: Client) -> None:
    env = {
        **os.environ,
        "SCO_TEMPORAL__ADDRESS": region_client.service_client.config.target_host,
        "SCO_TEMPORAL__NAMESPACE_PREFIX": services.namespace_prefix(region_client),
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_DATA_DIR": f"/tmp/sco-{uuid.uuid4().hex[:8]}",
    }
    code, out = await services.run_sco(env, "pool", "status", "r1.A.gp.l", cwd=REPO)
    assert code == 0, out
    ui = f"http://127.0.0.1:8233/namespaces/{env['SCO_TEMPORAL__NAMESPACE_PREFIX']}r1/workflows"
    assert out.splitlines()[:3] == [
        "r1.A.gp.l: admitted",
        f"  Temporal UI: {ui}/{exclusion_workflow_id('r1.A.gp.l')}",
        "  no notices, no transitions",
    ]
