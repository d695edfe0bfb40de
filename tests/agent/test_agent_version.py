"""`sco-agent --version`: the node agent names its version (an operator's first question
about a node), in its own process as systemd would start it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from agent.cli import main, version
from tests.support.paths import REPO


def test_version_is_the_installed_distributions() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", version())


def test_version_flag_prints_it_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"sco-agent {version()}\n"


def test_version_of_the_agent_process() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent", "--version"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("sco-agent ") and done.stderr == ""
