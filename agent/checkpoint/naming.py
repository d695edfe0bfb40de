"""Where a job's checkpoint socket lives: one directory per job, one name per job.

Both ends compute the name from the job's identity the same way: the agent from what its
scheduler lists, the workload from its environment (`SLURM_JOB_ID`, or `POD_NAMESPACE` and
`POD_NAME` from the downward API). The socket is `<socket_dir>/<name>/sock`.

Names never collide: every character outside `[A-Za-z0-9.-]` of a component is written
`%XX` (so `_`, `/` and `%` never appear raw in one), components are joined by `_`, and a name
too long for a Unix socket path becomes `<kind>~<sha256>` (`~` is always escaped in the
readable form, so the two forms cannot meet). `team-a/trainer` is `pod_team-a_trainer`,
`team/a-trainer` is `pod_team_a-trainer`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: The socket's file name inside its job's directory (short: sun_path holds 107 bytes).
SOCKET_FILE = "sock"
#: Readable names up to this long; longer ones are hashed. With the default socket dir
#: (/run/sco-agent/checkpoint, 25 bytes) the path stays under 107 bytes.
MAX_READABLE = 64
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-")


def _quote(component: str) -> str:
    if not component or component in (".", ".."):
        # Never a path component of its own, never empty: escape every byte.
        return "".join(f"%{b:02X}" for b in component.encode()) or "%"
    return "".join(
        ch if ch in _SAFE else "".join(f"%{b:02X}" for b in ch.encode()) for ch in component
    )


def _name(kind: str, *components: str) -> str:
    readable = "_".join([kind, *(_quote(c) for c in components)])
    if len(readable) <= MAX_READABLE:
        return readable
    digest = hashlib.sha256("\0".join(components).encode()).hexdigest()[:40]
    return f"{kind}~{digest}"


def slurm_job(job_id: str) -> str:
    """A Slurm job's name (`slurm_<id>`; array tasks `123_4` escape their `_`)."""
    return _name("slurm", job_id)


def pod(namespace: str, name: str) -> str:
    """A Kubernetes pod's name, unambiguous whatever the namespace and pod are called."""
    return _name("pod", namespace, name)


def process(pid: int) -> str:
    """A bare process's name (the `none` scheduler)."""
    return _name("pid", str(pid))


def job_dir(socket_dir: Path, name: str) -> Path:
    return socket_dir / name


def job_socket(socket_dir: Path, name: str) -> Path:
    return socket_dir / name / SOCKET_FILE


def name_from_env(env: dict[str, str], pid: int) -> str:
    """The name a workload registers under: its Slurm job, its pod, else its process."""
    if job := env.get("SLURM_JOB_ID"):
        return slurm_job(job)
    if (ns := env.get("POD_NAMESPACE")) and (pod_name := env.get("POD_NAME")):
        return pod(ns, pod_name)
    return process(pid)
