"""Every alert's runbook line names commands that exist: each `sco <group> <command>` is a
command of the CLI (as docs/reference.md lists it, generated from the code), and the node
agent is checked with `sco-agent --check` (there is no `sco-agent check`)."""

from __future__ import annotations

import re

import yaml

from tests.support.paths import REPO
from workers.devbox.prometheus import RULES_FILE

#: `sco` followed by lowercase words: the longest prefix that is a command must exist.
SCO_COMMAND = re.compile(r"(?<![\w/-])sco((?: [a-z][a-z-]*)+)")


def _runbooks() -> dict[str, str]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return {
        r["alert"]: r["annotations"]["runbook"] for g in groups for r in g["rules"] if "alert" in r
    }


def _commands() -> set[str]:
    reference = (REPO / "docs" / "reference.md").read_text()
    return {m.group(1) for m in re.finditer(r"(?m)^#{3,4} (sco(?: [a-z][a-z-]*)+)$", reference)}


def test_the_dependency_and_certificate_alerts_name_a_command() -> None:
    runbooks = _runbooks()
    for alert in (
        "SCONoticeRelayDegraded",
        "SCODeadLetters",
        "SCODependencyDown",
        "SCOClientCertificateExpiring",
    ):
        assert re.search(r"\bsco [a-z]|\bkubectl ", runbooks[alert]), alert


def test_the_sco_commands_a_runbook_names_exist() -> None:
    commands = _commands()
    assert "sco outbox dead-letters" in commands
    for alert, text in _runbooks().items():
        for m in SCO_COMMAND.finditer(text):
            words = ("sco" + m.group(1)).split()
            named = [" ".join(words[:n]) for n in range(len(words), 1, -1)]
            assert any(c in commands for c in named), f"{alert}: {' '.join(words)}"


def test_the_agent_is_checked_with_its_flag() -> None:
    text = RULES_FILE.read_text()
    assert "sco-agent check" not in text and "sco-agent --check" in text
    agent_cli = (REPO / "agent" / "check.py").read_text()
    assert "sco-agent --check" in agent_cli
