"""The one layering rule: the node plane and the contract layer never import the control
plane, so drains and admission keep working when Temporal and every worker are down."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONTROL_PLANE = {"workflows", "activities", "workers"}
NODE_AND_CONTRACT = ["agent", "contracts"]


def control_plane_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", ""))
            in {"import_module", "__import__"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        for name in names:
            if name.split(".")[0] in CONTROL_PLANE:
                shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
                found.append(f"{shown}:{getattr(node, 'lineno', 0)}: imports {name}")
    return found


def test_node_plane_and_contracts_never_import_the_control_plane() -> None:
    files = [p for pkg in NODE_AND_CONTRACT for p in (REPO / pkg).rglob("*.py")]
    assert files, "no files found: the check would pass vacuously"
    violations = [v for f in files for v in control_plane_imports(f)]
    assert violations == []


def test_the_check_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "probe.py"
    bad.write_text(
        "from workflows import search_attributes\nimport activities.fleet\n"
        "import importlib\nimportlib.import_module('workers.cli')\n"
    )
    assert len(control_plane_imports(bad)) == 3
