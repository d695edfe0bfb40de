"""Signal, query and update names are defined once, beside each workflow's models.

Running workflows answer to these strings, so a renamed constant would strand them: the
table pins every name. The workflows' decorators and their clients (the CLI, the
services, other workflows) use the constants, never a string of their own; each rule has
a probe proving its check can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from activities import budget
from tests.support.paths import REPO
from workflows.acquisition import models as acquisition
from workflows.controller import models as controller
from workflows.exclusion import models as exclusion
from workflows.floor import models as floor
from workflows.intake import models as intake
from workflows.lifecycle import models as lifecycle
from workflows.reconciler import models as reconciler
from workflows.slurm import models as slurm

#: (constant, the name running workflows know): never change the right-hand side.
PINNED: list[tuple[str, str, str]] = [
    ("budget.REQUEST_TOKENS_SIGNAL", budget.REQUEST_TOKENS_SIGNAL, "request_tokens"),
    ("budget.TOKENS_GRANTED_SIGNAL", budget.TOKENS_GRANTED_SIGNAL, "tokens_granted"),
    ("budget.SET_RATE_SIGNAL", budget.SET_RATE_SIGNAL, "set_rate"),
    ("budget.STATUS_QUERY", budget.STATUS_QUERY, "status"),
    ("controller.DEMAND_CHANGED_SIGNAL", controller.DEMAND_CHANGED_SIGNAL, "demand_changed"),
    ("controller.STATUS_QUERY", controller.STATUS_QUERY, "status"),
    ("exclusion.RECLAIM_NOTICED_SIGNAL", exclusion.RECLAIM_NOTICED_SIGNAL, "reclaim_noticed"),
    ("exclusion.STATUS_QUERY", exclusion.STATUS_QUERY, "status"),
    ("exclusion.EXCLUDE_UPDATE", exclusion.EXCLUDE_UPDATE, "exclude"),
    ("exclusion.READMIT_UPDATE", exclusion.READMIT_UPDATE, "readmit"),
    ("floor.HALL_LOST_SIGNAL", floor.HALL_LOST_SIGNAL, "hall_lost"),
    ("floor.HALL_RESTORED_SIGNAL", floor.HALL_RESTORED_SIGNAL, "hall_restored"),
    ("floor.STATUS_QUERY", floor.STATUS_QUERY, "status"),
    ("intake.COLLECT_NOW_SIGNAL", intake.COLLECT_NOW_SIGNAL, "collect_now"),
    ("intake.STATUS_QUERY", intake.STATUS_QUERY, "status"),
    ("lifecycle.PAUSE_SIGNAL", lifecycle.PAUSE_SIGNAL, "pause"),
    ("lifecycle.RESUME_SIGNAL", lifecycle.RESUME_SIGNAL, "resume"),
    ("lifecycle.STATUS_QUERY", lifecycle.STATUS_QUERY, "status"),
    ("reconciler.LAST_REPORT_QUERY", reconciler.LAST_REPORT_QUERY, "last_report"),
    ("slurm.PROGRESS_QUERY", slurm.PROGRESS_QUERY, "progress"),
    ("acquisition.PROGRESS_QUERY", acquisition.PROGRESS_QUERY, "progress"),
    ("acquisition.PAUSE_UPDATE", acquisition.PAUSE_UPDATE, "pause"),
    ("acquisition.RESUME_UPDATE", acquisition.RESUME_UPDATE, "resume"),
    ("acquisition.CANCEL_UPDATE", acquisition.CANCEL_UPDATE, "cancel"),
    (
        "acquisition.APPROVE_FALLBACK_UPDATE",
        acquisition.APPROVE_FALLBACK_UPDATE,
        "approve_fallback",
    ),
]

HANDLER_DECORATORS = frozenset({"signal", "query", "update"})
#: Client calls whose first argument is a handler name (or a method reference).
NAME_TAKING_CALLS = frozenset(
    {"signal", "query", "execute_update", "start_update", "following_signal"}
)
CLIENT_DIRS = ("workers", "workflows", "services", "activities", "bench")


@pytest.mark.parametrize(("constant", "value", "pinned"), PINNED, ids=[p[0] for p in PINNED])
def test_handler_names_are_pinned(constant: str, value: str, pinned: str) -> None:
    assert value == pinned, f"{constant} renamed: running workflows still answer to {pinned!r}"


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def unnamed_handlers(path: Path) -> list[str]:
    """Handlers whose decorator names them by a string or not at all (the method name)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for dec in node.decorator_list:
            call = dec if isinstance(dec, ast.Call) else None
            target = call.func if call else dec
            if isinstance(target, ast.Name) and target.id == "named_update":
                arg = call.args[0] if call and call.args else None
                if not isinstance(arg, ast.Name | ast.Attribute):
                    found.append(f"{_shown(path)}:{dec.lineno}: {node.name} has no name constant")
                continue
            if not (
                isinstance(target, ast.Attribute)
                and target.attr in HANDLER_DECORATORS
                and isinstance(target.value, ast.Name)
                and target.value.id == "workflow"
            ):
                continue
            name = next((k.value for k in call.keywords if k.arg == "name"), None) if call else None
            if not isinstance(name, ast.Name | ast.Attribute):
                found.append(f"{_shown(path)}:{dec.lineno}: {node.name} has no name constant")
    return found


def literal_names(path: Path) -> list[tuple[str, int, str]]:
    """(file, line, name) of each client call that names a handler by a string literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        first = node.args[0]
        # A handler name is an identifier; a ClickHouse client's `.query("SELECT ...")` is not.
        if (
            called in NAME_TAKING_CALLS
            and isinstance(first, ast.Constant)
            and isinstance(first.value, str)
            and first.value.isidentifier()
        ):
            found.append((_shown(path), node.lineno, first.value))
        for kw in node.keywords:
            if (
                kw.arg == "start_signal"
                and isinstance(kw.value, ast.Constant)
                and isinstance(kw.value.value, str)
            ):
                found.append((_shown(path), node.lineno, kw.value.value))
    return found


def test_every_handler_is_named_by_a_constant() -> None:
    files = sorted((REPO / "workflows").rglob("*.py"))
    assert files
    found = [v for f in files for v in unnamed_handlers(f)]
    assert found == []


def test_clients_call_handlers_by_constant() -> None:
    files = sorted(f for d in CLIENT_DIRS for f in (REPO / d).rglob("*.py"))
    assert files
    found = [f"{file}:{line}: {name!r}" for f in files for file, line, name in literal_names(f)]
    assert found == []


def test_the_checks_catch_a_string(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from temporalio import workflow\n"
        "class W:\n"
        "    @workflow.signal\n"
        "    def a(self) -> None: ...\n"
        "    @workflow.query(name='b')\n"
        "    def b(self) -> None: ...\n"
        "    @workflow.update(name=B_UPDATE)\n"
        "    async def c(self) -> None: ...\n"
        "    @named_update(D_UPDATE)\n"
        "    async def d(self) -> None: ...\n"
        "    @named_update('e')\n"
        "    async def e(self) -> None: ...\n"
        "async def client(h, wf):\n"
        "    await h.signal('demand_changed', 1)\n"
        "    await h.query(STATUS_QUERY)\n"
        "    ch.query('SELECT 1')\n"
        "    await h.execute_update('exclude', 2)\n"
        "    await wf.start_workflow('W', start_signal='reclaim_noticed')\n"
        "    with following_signal('demand_changed', 'Tick'): ...\n"
    )
    assert len(unnamed_handlers(probe)) == 3
    assert [name for _, _, name in literal_names(probe)] == [
        "demand_changed",
        "exclude",
        "reclaim_noticed",
        "demand_changed",
    ]
