"""Fresh Debian 12 node containers with the agent's .deb: the image and the package, built
once per session and shared by the tests that start such nodes
(tests/deploy/test_agent_deb_container.py, tests/deploy/test_region_as_shipped.py).

The node image is the debootstrapped base (deploy/image/base-image.sh, podman with runc as
in the reference) with python3 and what the package depends on, nothing else.
`as_the_unit_runs_it` is what systemd does for deploy/agent/sco-agent.service: its
directories, its environment, then ExecStartPre and ExecStart as its User.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import tools
from tests.support.paths import REPO

BASE = "localhost/debian:bookworm"
NODE_IMAGE = "localhost/sco-agent-node:bookworm"
ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / "deploy" / "image" / "containers.conf")}
UNIT = REPO / "deploy" / "agent" / "sco-agent.service"


def podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], env=ENV, capture_output=True, text=True, timeout=timeout
    )


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def unit_directories() -> list[str]:
    """The unit's RuntimeDirectory and StateDirectory lines, made as systemd makes them."""
    unit = unit_settings()
    user = unit["User"][0]
    lines = []
    for kind, base in (("RuntimeDirectory", "/run"), ("StateDirectory", "/var/lib")):
        mode = unit.get(f"{kind}Mode", ["0755"])[-1]
        for name in " ".join(unit.get(kind, [])).split():
            lines.append(f"install -d -o {user} -g {user} -m {mode} {base}/{name}")
    return lines


def unit_start() -> list[str]:
    """ExecStartPre, then ExecStart (exec), as the unit's User with its Environment."""
    unit = unit_settings()
    user = unit["User"][0]
    env = " ".join(shlex.quote(e) for e in unit["Environment"])
    caps = ",".join(
        "+" + c.lower().removeprefix("cap_")
        for c in " ".join(unit.get("AmbientCapabilities", [])).split()
    )
    keep = f" --inh-caps={caps} --ambient-caps={caps}" if caps else ""
    run = f"setpriv --reuid={user} --regid={user} --init-groups{keep} env {env}"
    return [f"{run} {unit['ExecStartPre'][0]}", f"exec {run} {unit['ExecStart'][0]}"]


def as_the_unit_runs_it() -> str:
    """A shell script doing what systemd does for the unit."""
    return "\n".join(["set -e", *unit_directories(), *unit_start()]) + "\n"


@pytest.fixture(scope="session")
def node_image() -> str:
    tools.require("podman", "runc", "debootstrap")
    base = subprocess.run(
        [str(REPO / "deploy" / "image" / "base-image.sh")],
        env=ENV, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert base.returncode == 0, base.stderr
    if podman("image", "exists", NODE_IMAGE).returncode != 0:
        # A fresh Debian 12 node: python3 and what the package depends on, nothing else.
        built = subprocess.run(
            ["podman", "build", "--network", "host", "-t", NODE_IMAGE, "-f", "-", str(REPO)],
            input=(
                f"FROM {BASE}\nRUN apt-get update -q && apt-get install -y -q "
                "--no-install-recommends python3 init-system-helpers passwd util-linux "
                "&& rm -rf /var/lib/apt/lists/*\n"
            ),
            env=ENV, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert built.returncode == 0, built.stderr[-2000:]
    return NODE_IMAGE


@pytest.fixture(scope="session")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("deb")
    done = subprocess.run(
        [str(REPO / "deploy/agent/build-deb.sh"), "--target", "debian12", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    yield Path(done.stdout.strip().splitlines()[-1])
