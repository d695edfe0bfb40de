"""deploy/agent/build-deb.sh: one package per Debian release (12: python3.11, 13: python3.13),
lintian-clean, files under /usr/lib/sco-agent, debhelper-style systemd maintainer scripts,
and the Debian 12 package's tree runs the agent on this machine's python3.11."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import tools
from tests.support.paths import REPO
from tests.support.systemd import systemd_verify

SCRIPT = REPO / "deploy" / "agent" / "build-deb.sh"
UPSTREAM = tomllib.loads((REPO / "deploy/agent/pyproject.toml").read_text())["project"]["version"]
TARGETS = {"debian12": ("3.11", "3.12", "bookworm"), "debian13": ("3.13", "3.14", "trixie")}
pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.services,  # build-deb.sh resolves the agent's dependencies from the index
    pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not installed"),
]


def build(out: Path, target: str) -> Path:
    done = subprocess.run(
        [str(SCRIPT), "--target", target, "--out", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHON": sys.executable},
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
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("deb")
    with ThreadPoolExecutor(2) as pool:  # mostly waiting on PyPI and xz: both at once
        built = {t: pool.submit(build, out, t) for t in TARGETS}
        return {t: f.result() for t, f in built.items()}


@pytest.mark.parametrize("target", TARGETS)
def test_each_release_gets_its_own_package_for_its_python(
    debs: dict[str, Path], target: str
) -> None:
    pyver, below, codename = TARGETS[target]
    deb = debs[target]
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True)
    version = f"{UPSTREAM}-1~deb{target.removeprefix('debian')}"
    assert deb.name == f"sco-agent_{version}_{arch.stdout.strip()}.deb"
    control = fields(deb)
    assert control["Package"] == "sco-agent" and control["Version"] == version
    assert control["Depends"] == (
        f"python3 (>= {pyver}~), python3 (<< {below}~), libc6, passwd, "
        "init-system-helpers (>= 1.52)"
    )
    assert control["Section"] == "admin" and control["Maintainer"]
    assert control["Description"].startswith("SCO node agent")

    files = contents(deb)
    assert not [p for p in files if p.startswith(("opt/", "etc/"))]
    unit = "lib/systemd/system" if target == "debian12" else "usr/lib/systemd/system"
    assert files[f"{unit}/sco-agent.service"].startswith("-rw-r--r--")
    assert files["usr/bin/sco-agent"].startswith("-rwxr-xr-x")
    for path in [
        "usr/lib/sco-agent/agent/daemon.py",
        "usr/lib/sco-agent/contracts/cache.py",
        "usr/lib/sco-agent/agent/py.typed",
        "usr/share/sco-agent/agent.toml.example",
        "usr/share/man/man8/sco-agent.8.gz",
        "usr/share/doc/sco-agent/copyright",
        "usr/share/doc/sco-agent/changelog.Debian.gz",
        "usr/share/lintian/overrides/sco-agent",
    ]:
        assert path in files, path
    tag = pyver.replace(".", "")
    modules = [p for p in files if p.endswith(".so")]
    assert f"usr/lib/sco-agent/_cffi_backend.cpython-{tag}-x86_64-linux-gnu.so" in (
        modules
    ) or not arch.stdout.startswith("amd64")
    assert not [m for m in modules if "cpython-" in m and f"cpython-{tag}-" not in m]
    lib = [p for p in files if p.startswith("usr/lib/sco-agent/") and p.count("/") > 3]
    tops = {p.split("/")[3] for p in lib}
    assert {"agent", "contracts", "nats", "nacl"} <= tops
    # No pydantic on a node (decision 0041), nor what only the control plane reads.
    assert not tops & {"workers", "workflows", "activities", "temporalio", "bin", "pydantic"}
    assert not tops & {"pydantic_core", "yaml"}
    assert not [p for p in files if "contracts/examples" in p or "__pycache__" in p]
    changelog = subprocess.run(
        ["sh", "-c", f"dpkg-deb --fsys-tarfile {deb} | tar -xO "
         "./usr/share/doc/sco-agent/changelog.Debian.gz | zcat | head -1"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert changelog.stdout.startswith(f"sco-agent ({version}) {codename}; urgency=")


def test_the_maintainer_scripts_use_deb_systemd_helper(
    debs: dict[str, Path], tmp_path: Path
) -> None:
    deb = debs["debian12"]
    subprocess.run(["dpkg-deb", "--control", str(deb), str(tmp_path)], check=True)
    scripts = {name: (tmp_path / name).read_text() for name in ["postinst", "prerm", "postrm"]}
    for name in scripts:
        subprocess.run(["sh", "-n", str(tmp_path / name)], check=True)  # parses
        assert os.access(tmp_path / name, os.X_OK)
    every = "\n".join(scripts.values())
    # systemctl only for daemon-reload (as debhelper does); the rest is d-s-h / d-s-invoke.
    calls = re.findall(r"^\s*systemctl (.*)$", every, re.M)
    assert calls and all(c.startswith("--system daemon-reload") for c in calls), calls
    assert "deb-systemd-helper enable 'sco-agent.service'" in scripts["postinst"]
    assert "deb-systemd-invoke try-restart 'sco-agent.service'" in scripts["postinst"]
    assert "deb-systemd-invoke stop 'sco-agent.service'" in scripts["prerm"]
    assert "deb-systemd-helper purge 'sco-agent.service'" in scripts["postrm"]
    assert "/usr/share/doc" not in every  # minimal images strip it
    postinst = scripts["postinst"]
    assert "useradd --system --user-group" in postinst
    assert "install -d -o sco-agent -g sco-agent -m 0750 /var/lib/sco-agent" in postinst
    assert "/usr/share/sco-agent/agent.toml.example" in postinst
    assert "python3.11 -m compileall -q -j 0 /usr/lib/sco-agent" in postinst
    assert "rm -rf /var/lib/sco-agent" in scripts["postrm"]  # purge


def test_the_debian12_tree_runs_the_agent_on_python311(
    debs: dict[str, Path], tmp_path: Path
) -> None:
    """The launcher, as /usr/bin/python3 -I would run it, on this machine's Debian Python
    (bookworm's python3 is 3.11): no venv, no pip, nothing installed at install time."""
    python = Path("/usr/bin/python3.11")
    if not python.exists():
        pytest.skip("no /usr/bin/python3.11 (Debian's python3.11) here")
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "--extract", str(debs["debian12"]), str(root)], check=True)
    launcher = (root / "usr/bin/sco-agent").read_text()
    assert launcher.startswith("#!/usr/bin/python3 -I\n")
    local = launcher.replace('"/usr/lib/sco-agent"', repr(str(root / "usr/lib/sco-agent")))
    (tmp_path / "sco-agent").write_text(local)
    helped = subprocess.run(
        [str(python), "-I", str(tmp_path / "sco-agent"), "--help"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert helped.returncode == 0 and "--check" in helped.stdout, helped.stderr
    probe = subprocess.run(
        [str(python), "-I", "-c",
         f"import sys; sys.path.insert(0, {str(root / 'usr/lib/sco-agent')!r});"
         "import agent.cli, agent.daemon, agent.check, agent.checkpoint.torch_dcp, contracts.cache;"
         "print(sorted(m for m in sys.modules if m.split('.')[0] in "
         "{'temporalio', 'workflows', 'activities', 'workers', 'pydantic'}))"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"  # the agent alone, no control plane
    unit = root / "lib/systemd/system/sco-agent.service"
    assert unit.read_text() == (REPO / "deploy/agent/sco-agent.service").read_text()
    if shutil.which("systemd-analyze") and Path("/lib/systemd/system").is_dir():
        assert systemd_verify(unit, root) == ""  # ExecStart= is the package's /usr/bin/sco-agent


@pytest.mark.parametrize("target", TARGETS)
def test_lintian_reports_no_errors_or_warnings(debs: dict[str, Path], target: str) -> None:
    tools.require("lintian")
    out = subprocess.run(
        ["lintian", "--tag-display-limit", "0", "--info", str(debs[target])],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    # Errors, warnings and info tags alike: the overrides file justifies the rest.
    tags = [line for line in out.stdout.splitlines() if re.match(r"^[EWI]: ", line)]
    assert tags == [], out.stdout
