"""Where the suite's time went, printed at the end of every run (CI's log included).

pytest's own `--durations` gives the slowest tests; this adds the set-up time of every
session fixture (a real service's bring-up: Temporal's dev server, tansu, RGW, a Slurm
cluster), summed over the xdist workers that started it, so a slow new service shows the
day it lands. And per xdist worker, when its tests ran: how long it was busy, when its
last test ended and what it ran last, so the run's critical path (the worker that ends last,
and what it was waiting on) shows without a second run. Workers send their figures to the
controller in `workeroutput`, xdist's channel for exactly this.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

_setup: defaultdict[str, list[float]] = defaultdict(list)
_KEY = "sco_session_fixture_setup"
#: (nodeid, start, end) in wall-clock seconds, of this process's tests (a worker's) or, on
#: xdist's controller, of every worker's (worker id -> its list).
_ran: list[tuple[str, float, float]] = []
_timeline: dict[str, list[tuple[str, float, float]]] = {}
_TIMELINE_KEY = "sco_test_timeline"
#: A worker's last tests shown at the end of the run.
_LAST_SHOWN = 3


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any]) -> Generator[None, Any, Any]:
    if fixturedef.scope != "session":
        return (yield)
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        _setup[fixturedef.argname].append(time.perf_counter() - start)


# The outermost wrapper (tryfirst), as prep.py's: a test's wait for the test cloud or the
# image counts as the worker's time, since the worker can do nothing else meanwhile.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, Any, Any]:
    start = time.time()
    try:
        return (yield)
    finally:
        _ran.append((item.nodeid, start, time.time()))


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the figures to the controller
        workeroutput[_KEY] = json.dumps(dict(_setup))
        workeroutput[_TIMELINE_KEY] = json.dumps(_ran)


def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist's controller: a worker finished; add its fixture times to ours."""
    raw = getattr(node, "workeroutput", {}).get(_KEY)
    if raw:
        for name, times in json.loads(raw).items():
            _setup[name].extend(times)
    ran = getattr(node, "workeroutput", {}).get(_TIMELINE_KEY)
    if ran:
        worker = getattr(node, "gateway", None)
        _timeline[getattr(worker, "id", f"gw{len(_timeline)}")] = [
            (nodeid, start, end) for nodeid, start, end in json.loads(ran)
        ]


def worker_lines(timeline: dict[str, list[tuple[str, float, float]]]) -> list[str]:
    """Per worker, in the order they finished: tests run, seconds busy, the second (from the
    first test's start on any worker) its last test ended, and its last tests."""
    timeline = {worker: ran for worker, ran in timeline.items() if ran}
    if not timeline:
        return []
    t0 = min(start for ran in timeline.values() for _, start, _ in ran)
    lines = []
    for worker, ran in sorted(timeline.items(), key=lambda kv: max(e for _, _, e in kv[1])):
        busy = sum(end - start for _, start, end in ran)
        last = sorted(ran, key=lambda r: r[2])[-_LAST_SHOWN:]
        shown = ", ".join(
            f"{nodeid.split('::')[-1][:60]} ({end - start:.0f} s)" for nodeid, start, end in last
        )
        lines.append(
            f"{worker}: {len(ran)} tests, busy {busy:.0f} s, "
            f"done at {max(e for _, _, e in ran) - t0:.0f} s; last: {shown}"
        )
    return lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if lines := worker_lines(_timeline):
        terminalreporter.write_sep("=", "xdist workers (busy, done at, last tests)")
        for line in lines:
            terminalreporter.write_line(line)
        if target := os.environ.get("SCO_TEST_TIMELINE"):  # every test's start and end
            Path(target).write_text(json.dumps(_timeline))
    if not _setup:
        return
    terminalreporter.write_sep("=", "session fixture set-up (s, all workers)")
    rows = sorted(_setup.items(), key=lambda kv: -sum(kv[1]))
    for name, times in rows:
        terminalreporter.write_line(
            f"{sum(times):8.1f}  {name}  ({len(times)}x, max {max(times):.1f})"
        )
    target = os.environ.get("SCO_FIXTURE_TIMES")
    if target:  # the bench report's suite row reads this
        Path(target).write_text(json.dumps({k: sum(v) for k, v in rows}, indent=1))
