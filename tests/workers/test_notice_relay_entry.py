"""`sco notice-relay` without the typer CLI (workers/cli/notice_relay.py, decision 0035)
refuses a command line, a setting or an option's value exactly as the typer command does:
the same one line on stderr and the same exit status, from the same program."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

CASES = [
    [],  # no --hall
    ["--hall"],
    ["--hall", "A", "--bogus"],
    ["--hall", "A", "--sweep-seconds", "x"],
    ["--hall", "A", "extra"],
    ["--hall=A", "--sweep-seconds=0"],
    ["--hall", "A", "--sweep-seconds", "nan"],
    ["--hall", "Z", "--region", "r1"],
    ["--hall", "A", "--region", "r9"],
    ["--hall", "A", "--region", ""],
]


def _run(entry: str, args: list[str], env: dict[str, str]) -> tuple[int, str]:
    code = f"import sys\nsys.argv = ['sco', 'notice-relay', *{args!r}]\n{entry}\n"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.returncode, out.stderr.strip()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a) or "nothing")
def test_it_refuses_as_the_typer_command_does(args: list[str]) -> None:
    env = {"PATH": "/usr/bin:/bin", "SCO_REGIONS_DIR": str(REPO / "deploy" / "regions")}
    light = _run("from workers.cli.entry import main\nmain()", args, env)
    typer = _run("from workers.cli.main import main\nmain()", args, env)
    assert light[0] in (1, 2) and light[1].startswith("error: "), light
    assert light == typer


def test_a_settings_error_names_the_file_and_field(tmp_path: Path) -> None:
    cfg = tmp_path / "sco.toml"
    cfg.write_text("[notice_relay]\nmax_backoff_seconds = -1\n")
    env = {"PATH": "/usr/bin:/bin", "SCO_CONFIG": str(cfg)}
    code, err = _run("from workers.cli.entry import main\nmain()", ["--hall", "A"], env)
    assert code == 1
    assert err == (
        f"error: {cfg} or SCO_* environment: notice_relay.max_backoff_seconds: "
        "Input should be greater than 0"
    )
