"""Where the suite's time went, printed at the end of every run (CI's log included).

pytest's own `--durations` gives the slowest tests; this adds the set-up time of every
session fixture (a real service's bring-up: Temporal's dev server, tansu, RGW, a Slurm
cluster), summed over the xdist workers that started it, so a slow new service shows the
day it lands. Workers send their figures to the controller in `workeroutput`, xdist's
channel for exactly this.
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


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any]) -> Generator[None, Any, Any]:
    if fixturedef.scope != "session":
        return (yield)
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        _setup[fixturedef.argname].append(time.perf_counter() - start)


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the figures to the controller
        workeroutput[_KEY] = json.dumps(dict(_setup))


def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist's controller: a worker finished; add its fixture times to ours."""
    raw = getattr(node, "workeroutput", {}).get(_KEY)
    if raw:
        for name, times in json.loads(raw).items():
            _setup[name].extend(times)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
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
