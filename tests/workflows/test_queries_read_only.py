"""Every workflow query handler is read-only by construction: no assignment to, and no
mutating call on, anything reached from `self`. A query runs between and during workflow
tasks, on whichever worker answers, and is not in history: a write there is state that
replay does not reproduce (issue 37 asked for this of every workflow)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

MUTATORS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "popitem",
        "remove",
        "clear",
        "update",
        "add",
        "discard",
        "setdefault",
        "sort",
        "reverse",
    }
)


def _rooted_at_self(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def _is_query(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute) and target.attr == "query":
            return True
    return False


def writes_in_queries(source: str) -> list[str]:
    """`<query>: line N` for each write to self-reached state inside a query handler."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or not _is_query(fn):
            continue
        for node in ast.walk(fn):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
            ):
                targets = [node.func.value]
            if any(_rooted_at_self(t) for t in targets):
                found.append(f"{fn.name}: line {getattr(node, 'lineno', 0)}")
    return found


WORKFLOW_FILES = sorted((REPO / "workflows").rglob("*.py"))


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_query_handlers_write_nothing(path: Path) -> None:
    assert writes_in_queries(path.read_text()) == []


def test_the_check_sees_a_write() -> None:
    bad = (
        "class W:\n"
        "    @workflow.query\n"
        "    def status(self):\n"
        "        self._status.pending = self._dirty\n"
        "        self._seen.append(1)\n"
        "        return self._status\n"
    )
    assert writes_in_queries(bad) == ["status: line 4", "status: line 5"]
