"""`sco ledger book-drains` without the typer CLI (workers/cli/drain_intake.py) refuses a
command line, a setting or a region exactly as the typer command does: the same one line
on stderr and the same exit status, from the same program; and it loads none of the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

CASES = [
    ["--region"],
    ["--bogus"],
    ["extra"],
    ["--region", "r9"],
    ["--region=r1", "--region", ""],
]
ENV = {"PATH": "/usr/bin:/bin", "SCO_REGIONS_DIR": str(REPO / "deploy" / "regions")}


def _run(entry: str, args: list[str], env: dict[str, str]) -> tuple[int, str]:
    code = f"import sys\nsys.argv = ['sco', 'ledger', 'book-drains', *{args!r}]\n{entry}\n"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    return out.returncode, out.stderr.strip()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a) or "nothing")
def test_it_refuses_as_the_typer_command_does(args: list[str]) -> None:
    light = _run("from workers.cli.entry import main\nmain()", args, ENV)
    typer = _run("from workers.cli.main import main\nmain()", args, ENV)
    assert light[0] in (1, 2) and light[1].startswith("error: "), light
    assert light == typer


@pytest.mark.timeout(120)
def test_a_settings_error_names_the_file_and_field(tmp_path: Path) -> None:
    cfg = tmp_path / "sco.toml"
    cfg.write_text("drain_intake_metrics_port = -1\n")
    env = {**ENV, "SCO_CONFIG": str(cfg)}
    light = _run("from workers.cli.entry import main\nmain()", [], env)
    typer = _run("from workers.cli.main import main\nmain()", [], env)
    assert light[0] == 1 and "drain_intake_metrics_port" in light[1] and "\n" not in light[1]
    assert light == typer


@pytest.mark.timeout(120)
def test_the_intake_loads_none_of_the_cli() -> None:
    """What `sco ledger book-drains` holds when it starts its loop."""
    probe = (
        "import sys\nfrom workers.cli import drain_intake\n"
        "from services.registry import service\nservice('drain-intake').load()\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'typer', 'click', 'rich'}),"
        " 'workers.cli.common' in sys.modules, 'workers.cli.ledger' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "False", "False"]
