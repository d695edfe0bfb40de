"""The SCO image (`make image`): every process's entry point runs in it as uid 10001, the
worker's build id is its tag, and the dependencies are exactly requirements.lock's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.support.image import IMAGE, current_image
from tests.support.paths import REPO

PODMAN = shutil.which("podman")
ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / "deploy" / "image" / "containers.conf")}


def _podman(*args: str) -> subprocess.CompletedProcess[str]:
    assert PODMAN is not None
    return subprocess.run([PODMAN, *args], env=ENV, capture_output=True, text=True, timeout=120)


def _image_or_skip() -> None:
    if PODMAN is None:
        pytest.skip("podman not installed (apt-get install podman runc): image tests skipped")
    current_image()  # this tree's, never one an earlier checkout left under the same tag


def _name(project: str) -> str:
    return re.sub(r"[-_.]+", "-", project).lower()  # PEP 503


@pytest.mark.timeout(180)
def test_image_runs_every_entry_point_as_uid_10001() -> None:
    _image_or_skip()
    out = _podman("run", "--rm", "--network", "none", IMAGE, "id", "-u")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "10001"
    for args in (["worker"], ["notice-relay"], ["outbox", "relay"], ["ledger", "consume"]):
        run = _podman("run", "--rm", "--network", "none", IMAGE, "sco", *args, "--help")
        assert run.returncode == 0, (args, run.stderr[-500:])


@pytest.mark.timeout(180)
def test_image_holds_exactly_the_locked_dependencies() -> None:
    _image_or_skip()
    out = _podman("run", "--rm", "--network", "none", IMAGE, "pip", "freeze", "--all")
    assert out.returncode == 0, out.stderr
    installed = {
        _name(m.group(1)): m.group(2)
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)$", out.stdout, re.M)
    }
    locked = {
        _name(m.group(1)): m.group(2)
        for m in re.finditer(
            r"^([A-Za-z0-9_.-]+)==(\S+) ", (REPO / "requirements.lock").read_text(), re.M
        )
    }
    assert locked
    assert {n: v for n, v in locked.items() if installed.get(n) != v} == {}


def test_the_lock_holds_every_dependency_of_pyproject() -> None:
    """The image installs requirements.lock only (--no-deps): a dependency added to
    pyproject.toml but not locked (`make lock`) is missing at run time."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {_name(re.split(r"[\[<>=!~; ]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    locked = {
        _name(m.group(1))
        for m in re.finditer(
            r"^([A-Za-z0-9_.-]+)==", (REPO / "requirements.lock").read_text(), re.M
        )
    }
    assert sorted(wanted - locked) == []
