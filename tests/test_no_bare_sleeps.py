"""Tests wait one way: through tests/support/wait.py, never a bare sleep.

A polling loop or a "give it a moment" sleep is a guess at how long something takes; on a
loaded 2-core CI machine the guess is wrong and the test flakes, and when it fails it says
nothing about what did not happen. `eventually`/`eventually_async` poll with a deadline and
say what they waited for. What stays is a sleep that *is* the behaviour under test (a slow
fake, a "nothing happens within N s" check, a pause between chaos kills), and each says so
with `MARKER` and a reason on its line or the line directly above. A probe proves the scan
can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

MARKER = "# sleep is the behaviour under test:"
#: The one home of polling: its sleeps are the waiting itself.
ALLOWED = frozenset({Path("tests/support/wait.py")})
#: The modules whose `sleep` blocks a test for a fixed time.
SLEEPERS = frozenset({"time", "asyncio"})


def sleep_calls(tree: ast.AST) -> list[int]:
    """Lines of the calls to `time`'s or `asyncio`'s sleep, through any import spelling."""
    modules: set[str] = set()  # local names bound to the time or asyncio module
    sleeps: set[str] = set()  # local names bound to their sleep functions
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name in SLEEPERS}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in SLEEPERS:
            sleeps |= {a.asname or a.name for a in node.names if a.name == "sleep"}
    lines: list[int] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "sleep"
            and isinstance(func.value, ast.Name)
            and func.value.id in modules
        ) or (isinstance(func, ast.Name) and func.id in sleeps):
            lines.append(node.lineno)
    return sorted(lines)


def _marked(source: list[str], line: int) -> bool:
    """Whether the line (1-based) or the one above carries the marker and a reason."""
    for text in source[max(0, line - 2) : line]:
        _, found, reason = text.partition(MARKER)
        if found and reason.strip():
            return True
    return False


def bare_sleeps(path: Path, shown: Path) -> list[str]:
    text = path.read_text()
    source = text.splitlines()
    tree = ast.parse(text, filename=str(path))
    return [f"{shown}:{line}" for line in sleep_calls(tree) if not _marked(source, line)]


def test_every_sleep_in_tests_is_the_behaviour_under_test() -> None:
    found: list[str] = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        shown = path.relative_to(REPO)
        if shown not in ALLOWED:
            found += bare_sleeps(path, shown)
    assert not found, (
        "wait with tests/support/wait.py (eventually / eventually_async, what=...) instead of "
        f"sleeping; a sleep that is itself under test says so with {MARKER!r} and a reason "
        "on its line or the line above:\n" + "\n".join(found)
    )


def test_the_scan_finds_every_spelling_and_honours_the_marker(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import asyncio as aio\n"
        "import time as clock\n"
        "from time import sleep\n"
        "from asyncio import sleep as nap\n"
        "clock.sleep(1)\n"
        "sleep(1)\n"
        "async def f():\n"
        "    await aio.sleep(1)\n"
        "    await nap(1)\n"
        f"    {MARKER} a slow fake\n"
        "    await nap(2)\n"
        f"    await aio.sleep(3)  {MARKER} the quiet period\n"
        "    await workflow.sleep(4)\n"
        f"    await aio.sleep(5)  {MARKER}\n"
        "    await env.sleep(6)\n"
    )
    lines = [int(hit.rsplit(":", 1)[1]) for hit in bare_sleeps(probe, Path("probe.py"))]
    # A marker without a reason does not count; other objects' sleep (a workflow timer,
    # the time-skipping environment) is not a wall-clock wait.
    assert lines == [5, 6, 8, 9, 14]
