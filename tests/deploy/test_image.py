"""The SCO image (`make image`): every process's entry point runs in it as uid 10001, the
worker's build id is its tag, and the dependencies are exactly requirements.lock's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

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
    for args in (
        ["worker"],
        ["notice-relay"],
        ["outbox", "relay"],
        ["ledger", "consume"],
        ["contracts", "sync"],
    ):
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


def _host_git(*args: str, cwd: Path) -> str:
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@x", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.timeout(180)
def test_image_verifies_ssh_signed_commits_as_the_contract_sync_does(tmp_path: Path) -> None:
    """The contract sync's signature check (contracts/gitrepo.py: `git verify-commit`,
    gpg.format=ssh, which runs ssh-keygen) inside the image as uid 10001: git 2.34 or later
    and ssh-keygen are there; a signed commit verifies, an unsigned one does not."""
    if shutil.which("git") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("git or ssh-keygen missing on the host: apt-get install git openssh-client")
    _image_or_skip()
    key = tmp_path / "alice_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (tmp_path / "allowed_signers").write_text(
        f"alice@example.org {key.with_suffix('.pub').read_text()}"
    )
    work = tmp_path / "work"
    work.mkdir()
    _host_git("init", "--quiet", "-b", "main", cwd=work)
    (work / "a.yaml").write_text("a: 1\n")
    _host_git("add", "-A", cwd=work)
    _host_git(
        "-c", "gpg.format=ssh", "-c", f"user.signingkey={key}", "commit", "-S", "-qm", "s", cwd=work
    )
    signed = _host_git("rev-parse", "HEAD", cwd=work)
    _host_git("commit", "--allow-empty", "-qm", "u", cwd=work)
    unsigned = _host_git("rev-parse", "HEAD", cwd=work)
    _host_git("clone", "--quiet", "--bare", str(work), str(tmp_path / "repo.git"), cwd=tmp_path)
    key.unlink()  # the private key stays out of the container
    subprocess.run(["chmod", "-R", "a+rX", str(tmp_path)], check=True)
    script = (
        "import shutil, subprocess, sys; from pathlib import Path; "
        "from contracts.gitrepo import GitMirror; "
        "print(subprocess.run(['git', '--version'], capture_output=True, text=True).stdout); "
        "shutil.copytree('/in/repo.git', '/tmp/repo.git'); "
        "m = GitMirror(Path('/tmp/repo.git')); "
        "[print(c, v.good, v.signer, v.reason) "
        "for c in sys.argv[1:] for v in [m.verify(c, Path('/in/allowed_signers'))]]"
    )
    out = _podman(
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        f"{tmp_path}:/in:ro",
        IMAGE,
        "python3",
        "-c",
        script,
        signed,
        unsigned,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    version = re.search(r"git version (\d+)\.(\d+)", out.stdout)
    assert version is not None, out.stdout
    assert (int(version[1]), int(version[2])) >= (2, 34), out.stdout
    assert f"{signed} True alice@example.org" in out.stdout, out.stdout
    assert f"{unsigned} False  unsigned" in out.stdout, out.stdout
