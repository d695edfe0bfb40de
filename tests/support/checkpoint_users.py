"""Users of their own and the shipped unit's socket layout, for the checkpoint trust tests.

The machine runs the tests as root: `make_user` adds a system user (and its group) with
`useradd`; `as_user` runs a process as one with `setpriv` (its groups from the user
database, the capabilities the unit gives the agent when asked). The layout is read from
deploy/agent/sco-agent.service: its RuntimeDirectory= list and mode, its User= (played by
a test user), the socket dir it hands the agent (SCO_AGENT_SOCKET_DIR) and the ambient
capabilities, so a change to the unit is a change to what these tests run.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.paths import REPO

UNIT = REPO / "deploy" / "agent" / "sco-agent.service"


def unit_directives(unit: Path = UNIT) -> dict[str, list[str]]:
    """The [Service] section's directives, each with its values in order."""
    found: dict[str, list[str]] = {}
    section = ""
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]" and "=" in line:
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


def can_run_users() -> str:
    """Why these tests cannot run here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root to add users and switch to them (useradd, setpriv)"
    for tool in ("useradd", "userdel", "setpriv"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if unprivileged_python() is None:
        return "no Python an unprivileged user can run with this venv's packages"
    return ""


def make_user(prefix: str) -> User:
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/",
         "--shell", "/usr/sbin/nologin", name],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid)


def remove_user(user: User) -> None:
    subprocess.run(["userdel", user.name], capture_output=True, timeout=60, check=False)


def unprivileged_python() -> list[str] | None:
    """A Python of this venv's version that any user may run (the venv's own may live
    under /root): the venv's, else the system's of the same version."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (Path(sys.executable).resolve(), Path("/usr/bin") / version):
        if candidate.is_file() and _world_runnable(candidate):
            return [str(candidate)]
    return None


def _world_runnable(path: Path) -> bool:
    if not os.stat(path).st_mode & 0o001:
        return False
    return all(os.stat(p).st_mode & 0o001 for p in path.parents)


def _site_packages() -> str:
    import pydantic

    return str(Path(pydantic.__file__).parent.parent)


@dataclass(frozen=True)
class Layout:
    """The unit's runtime directories under `root` (for /), owned by `agent`."""

    root: Path
    agent: User
    socket_dir: Path
    ambient_caps: tuple[str, ...]


def shipped_layout(root: Path, agent: User) -> Layout:
    unit = unit_directives()
    mode = int(unit.get("RuntimeDirectoryMode", ["0755"])[-1], 8)
    for name in " ".join(unit.get("RuntimeDirectory", [])).split():
        path = root / "run" / name
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, agent.uid, agent.gid)
        os.chmod(path, mode)
    env = dict(v.split("=", 1) for e in unit.get("Environment", []) for v in e.split())
    socket_dir = root / env["SCO_AGENT_SOCKET_DIR"].lstrip("/")
    caps = tuple(
        c.lower().removeprefix("cap_")
        for c in " ".join(unit.get("AmbientCapabilities", [])).split()
    )
    return Layout(root, agent, socket_dir, caps)


def as_user(user: User, *, caps: tuple[str, ...] = ()) -> list[str]:
    argv = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups"]
    if caps:
        wanted = ",".join(f"+{c}" for c in caps)
        argv += [f"--inh-caps={wanted}", f"--ambient-caps={wanted}"]
    return argv


def role_argv(user: User, spec: dict[str, Any], *, caps: tuple[str, ...] = ()) -> list[str]:
    python = unprivileged_python()
    assert python is not None
    return [*as_user(user, caps=caps), *python, "-m", "tests.support.checkpoint_roles",
            json.dumps(spec)]  # fmt: skip


def role_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TZ")}
    return {
        **keep,
        "HOME": "/",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": f"{REPO}:{_site_packages()}",
        **(extra or {}),
    }


def run_role(
    user: User, spec: dict[str, Any], *, caps: tuple[str, ...] = (), timeout: float = 60
) -> list[dict[str, Any]]:
    """Run a role to its end as `user`; its JSON lines."""
    done = subprocess.run(
        role_argv(user, spec, caps=caps), cwd=REPO, env=role_env(),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def start_role(
    user: User, spec: dict[str, Any], env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start a long-running role (a server) as `user`; stop it with `stop_role`."""
    return subprocess.Popen(
        role_argv(user, spec), cwd=REPO, env=role_env(env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def stop_role(proc: subprocess.Popen[str]) -> tuple[list[dict[str, Any]], str]:
    """Stop a role; its JSON lines and its stderr."""
    if proc.poll() is None:
        proc.terminate()
    out, err = proc.communicate(timeout=30)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], err
