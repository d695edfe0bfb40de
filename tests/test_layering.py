"""Imports run one way: workers → workflows → activities → (contracts, planning).

The node plane (`agent`) and the contract layer never import the control plane or Temporal,
so drains and admission keep working when Temporal and every worker are down; `planning`
is pure (no I/O, no Temporal), so workflows replay it and activities may call it. Each rule
has a probe proving its check can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

#: package -> the top-level modules it must never import.
FORBIDDEN: dict[str, frozenset[str]] = {
    "agent": frozenset({"workflows", "activities", "workers", "planning", "temporalio"}),
    "contracts": frozenset({"workflows", "activities", "workers", "planning", "temporalio"}),
    "planning": frozenset({"workflows", "activities", "workers", "agent", "temporalio"}),
    # The estate simulator drives the pure policy code only, like planning is.
    "estate": frozenset({"workflows", "activities", "workers", "agent", "temporalio"}),
    "activities": frozenset({"workflows", "workers"}),
    "workflows": frozenset({"workers"}),
}


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every absolute import, static or by importlib/__import__."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", ""))
            in {"import_module", "__import__"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def violations(path: Path, forbidden: frozenset[str]) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return [
        f"{shown}:{line}: imports {name}"
        for line, name in imported_modules(tree)
        if name.split(".")[0] in forbidden
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_run_one_way(package: str) -> None:
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"no files in {package}/: the check would pass vacuously"
    found = [v for f in files for v in violations(f, FORBIDDEN[package])]
    assert found == []


PROBES = {
    "agent": "import temporalio.client\nfrom workflows import search_attributes\n",
    "contracts": "from temporalio import workflow\nimport activities.fleet\n",
    "planning": "from activities.events import InstanceState\nimport temporalio\n",
    "estate": "from workflows.floor.plan import plan_floor\nimport temporalio.workflow\n",
    "activities": "from workflows.exclusion.models import ExclusionInput\n"
    "import importlib\nimportlib.import_module('workers.cli')\n",
    "workflows": "from workers.settings import Settings\n__import__('workers.region_worker')\n",
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_each_rule_catches_a_violation(package: str, tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBES[package])
    assert len(violations(probe, FORBIDDEN[package])) == 2


def test_allowed_directions_pass(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from activities.events import InstanceState\nimport planning.costs\n")
    assert violations(probe, FORBIDDEN["workflows"]) == []
