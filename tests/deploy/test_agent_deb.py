"""deploy/agent/build-deb.sh: the .deb's control fields, maintainer scripts and files, and
that the wheelhouse it carries installs the agent offline, as postinst does on a node."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.systemd import systemd_verify

SCRIPT = REPO / "deploy" / "agent" / "build-deb.sh"
VERSION = tomllib.loads((REPO / "deploy/agent/pyproject.toml").read_text())["project"]["version"]
PYVER = f"{sys.version_info.major}.{sys.version_info.minor}"
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not installed"),
]


def build(out: Path, *args: str) -> Path:
    done = subprocess.run(
        [str(SCRIPT), "--out", str(out), *args],
        capture_output=True, text=True, timeout=100, env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    deb = Path(done.stdout.strip().splitlines()[-1])
    assert deb.parent == out and deb.is_file()
    return deb


def fields(deb: Path) -> dict[str, str]:
    out = subprocess.run(["dpkg-deb", "--field", str(deb)], capture_output=True, text=True)
    return dict(re.findall(r"^(\S+): (.*)$", out.stdout, re.M))


def contents(deb: Path) -> dict[str, str]:
    """path -> mode string (plus " -> target" for a symlink)."""
    out = subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True, text=True)
    entries = {}
    for line in out.stdout.splitlines():
        mode, owner, _, _, _, path, *rest = line.split(None, 6)
        assert owner == "root/root", line
        entries[path.removeprefix("./")] = mode + "".join(rest)
    return entries


@pytest.fixture(scope="module")
def full_deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("deb"))


def test_the_package_carries_the_unit_the_docs_and_a_complete_wheelhouse(full_deb: Path) -> None:
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True)
    # pydantic-core, pynacl, pyyaml are binary wheels: the package is for this arch/Python.
    assert full_deb.name == f"sco-agent_{VERSION}_{arch.stdout.strip()}.deb"
    control = fields(full_deb)
    assert control["Package"] == "sco-agent" and control["Version"] == VERSION
    assert control["Depends"] == f"python{PYVER}, python{PYVER}-venv, passwd"
    assert control["Section"] == "admin" and control["Maintainer"]
    assert int(control["Installed-Size"]) > 1000  # KiB, the wheels
    assert control["Description"].startswith("SCO node agent")

    files = contents(full_deb)
    assert files["lib/systemd/system/sco-agent.service"].startswith("-rw-r--r--")
    assert files["usr/bin/sco-agent"] == "lrwxrwxrwx-> /opt/sco-agent/venv/bin/sco-agent"
    for doc in ["README.md", "agent.toml.example", "copyright"]:
        assert f"usr/share/doc/sco-agent/{doc}" in files
    wheels = {p.split("/")[-1].split("-")[0].lower() for p in files if p.endswith(".whl")}
    assert {"sco_agent", "nats_py", "pynacl", "pydantic", "pydantic_core", "pyyaml"} <= wheels
    assert not any(p.startswith(("etc/", "opt/sco-agent/venv")) for p in files)


def test_the_maintainer_scripts_create_the_user_dirs_and_venv(
    full_deb: Path, tmp_path: Path
) -> None:
    info = subprocess.run(["dpkg-deb", "--info", str(full_deb)], capture_output=True, text=True)
    for script in ["postinst", "prerm", "postrm"]:  # listed with `*`: executable
        assert re.search(rf"\*\s+{script}\s+#!/bin/sh", info.stdout), info.stdout
    subprocess.run(["dpkg-deb", "--control", str(full_deb), str(tmp_path)], check=True)
    for script in ["postinst", "prerm", "postrm"]:
        subprocess.run(["sh", "-n", str(tmp_path / script)], check=True)  # parses
    postinst = (tmp_path / "postinst").read_text()
    assert "useradd --system --user-group" in postinst and "sco-agent\n" in postinst
    assert "install -d -o sco-agent -g sco-agent -m 0750 /var/lib/sco-agent" in postinst
    assert f"/usr/bin/python{PYVER} -m venv /opt/sco-agent/venv" in postinst
    assert f'--no-index \\\n        --find-links /opt/sco-agent/wheels "sco-agent=={VERSION}"' in (
        postinst
    )
    assert "systemctl enable sco-agent.service" in postinst
    assert "systemctl stop sco-agent.service" in (tmp_path / "prerm").read_text()
    postrm = (tmp_path / "postrm").read_text()
    assert "rm -rf /opt/sco-agent/venv /var/lib/sco-agent" in postrm  # purge
    md5 = (tmp_path / "md5sums").read_text()
    assert "lib/systemd/system/sco-agent.service" in md5


def test_the_wheelhouse_installs_offline_and_the_unit_verifies(
    full_deb: Path, tmp_path: Path
) -> None:
    """What postinst does, inside an extracted copy of the package: venv, pip --no-index."""
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "--extract", str(full_deb), str(root)], check=True)
    assert (root / "lib/systemd/system/sco-agent.service").read_text() == (
        REPO / "deploy/agent/sco-agent.service"
    ).read_text()
    venv = root / "opt/sco-agent/venv"
    python = Path(f"/usr/bin/python{PYVER}")
    subprocess.run(
        [str(python if python.exists() else sys.executable), "-m", "venv", str(venv)], check=True
    )
    pip = subprocess.run(
        [str(venv / "bin/pip"), "install", "--quiet", "--no-index", "--disable-pip-version-check",
         "--find-links", str(root / "opt/sco-agent/wheels"), f"sco-agent=={VERSION}"],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr
    helped = subprocess.run([str(venv / "bin/sco-agent"), "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "--check" in helped.stdout
    probe = subprocess.run(
        [str(venv / "bin/python"), "-c",
         "import sys, agent.daemon, agent.checkpoint.torch_dcp, contracts.cache;"
         "print(sorted(m for m in sys.modules if m.split('.')[0] in "
         "{'temporalio', 'workflows', 'activities', 'workers'}))"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"  # the agent alone, no control plane
    if shutil.which("systemd-analyze") and Path("/lib/systemd/system").is_dir():
        # ExecStart= is the venv's real console script now.
        assert systemd_verify(root / "lib/systemd/system/sco-agent.service", root) == ""


def test_the_agent_wheel_holds_agent_and_contracts_only(full_deb: Path, tmp_path: Path) -> None:
    subprocess.run(["dpkg-deb", "--extract", str(full_deb), str(tmp_path)], check=True)
    [wheel] = (tmp_path / "opt/sco-agent/wheels").glob(f"sco_agent-{VERSION}-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("sco_agent-")}
    assert tops == {"agent", "contracts"}
    assert "agent/checkpoint/torch_dcp.py" in names and "agent/py.typed" in names
    assert not any(n.startswith("contracts/examples") for n in names)


def test_the_no_venv_variant_is_architecture_independent(tmp_path: Path) -> None:
    deb = build(tmp_path, "--no-venv")
    assert deb.name == f"sco-agent_{VERSION}_all.deb"
    control = fields(deb)
    assert control["Architecture"] == "all"
    assert control["Depends"] == "python3 (>= 3.11), python3-venv, passwd"
    wheels = [p for p in contents(deb) if p.endswith(".whl")]
    assert wheels == [f"opt/sco-agent/wheels/sco_agent-{VERSION}-py3-none-any.whl"]
    subprocess.run(["dpkg-deb", "--control", str(deb), str(tmp_path / "c")], check=True)
    postinst = (tmp_path / "c/postinst").read_text()
    assert "--no-index" not in postinst  # dependencies come from the node's pip index


def test_lintian_if_installed(full_deb: Path) -> None:
    if shutil.which("lintian") is None:
        pytest.skip("lintian not installed")
    out = subprocess.run(
        ["lintian", "--no-tag-display-limit", str(full_deb)],
        capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    errors = [line for line in out.stdout.splitlines() if line.startswith("E:")]
    assert errors == [], out.stdout
