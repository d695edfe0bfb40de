"""What `make test` prepares beside the tests instead of before them.

The test cloud (~3.5 min from a fresh clone), the image (~4 min) and lint (~1.5 min) used to
finish before pytest started; only the test cloud's and podman's tests need the first two.
`tests/run_suite.sh` now starts them in the background and the suite at once, marking each
preparation in `$SCO_PREP_DIR`: `<name>.log` from its start, `<name>.rc` (its exit code)
when it is done. A test that needs one waits for its `.rc` before the test's own clock
(pytest-timeout) starts, so a slow bring-up is not a test timeout; whether the preparation
worked is the test's own check (the test cloud answers, the image builds), which then names
the preparation's log.

Without `$SCO_PREP_DIR` (a developer's `pytest` after `make testcloud-up`) nothing waits.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pytest

from tests.support.parallel import PODMAN_MODULES
from tests.support.wait import eventually

PREP_DIR_ENV = "SCO_PREP_DIR"
#: The longest a test waits for a preparation: the test cloud on a bare, busy machine.
PREP_TIMEOUT_S = 1500.0


def needed_by(item: pytest.Item) -> list[str]:
    """The preparations a test needs done before it starts."""
    needs = []
    if item.get_closest_marker("testcloud") is not None:
        needs.append("testcloud")
    if item.nodeid.split("::", 1)[0] in PODMAN_MODULES:
        needs.append("image")
    return needs


def _files(name: str) -> tuple[Path, Path] | None:
    base = os.environ.get(PREP_DIR_ENV)
    if not base:
        return None
    return Path(base) / f"{name}.log", Path(base) / f"{name}.rc"


def outcome(name: str) -> str | None:
    """Why a preparation failed (its exit code and log), None when it worked or none ran."""
    files = _files(name)
    if files is None or not files[1].exists():
        return None
    log, rc = files
    code = rc.read_text().strip()
    if code == "0":
        return None
    tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else []
    return f"preparing {name} failed (exit {code}, {log}): " + " | ".join(tail)


def ran(name: str) -> bool:
    """Whether `make test` started the preparation `name` in this session."""
    files = _files(name)
    return files is not None and files[0].exists()


def await_prep(name: str) -> None:
    """Wait until the preparation `name` is done, when `make test` started one."""
    files = _files(name)
    if files is None or not files[0].exists():
        return
    log, rc = files
    eventually(rc.exists, timeout=PREP_TIMEOUT_S, what=f"{name} to be prepared ({log})", every=2.0)


# tryfirst: the outermost wrapper, so the wait is outside pytest-timeout's per-test clock.
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    for name in needed_by(item):
        await_prep(name)
    yield
