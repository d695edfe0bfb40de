"""The agent's side of the socket layout: one directory per job, owned by the job's user.

    /run/sco-agent/checkpoint/          sco-agent:sco-agent 0711 (systemd, the unit's
                                        RuntimeDirectory): no tenant can create anything here
    /run/sco-agent/checkpoint/<name>/   <job's uid>:sco-agent 0770 (made here): the job
                                        binds its socket in it; only its user and the agent
                                        (the group) can enter it
    /run/sco-agent/checkpoint/<name>/sock   mode 0666: the directory is the gate

Why the agent makes them (with CAP_CHOWN, its only capability, usable only under the
paths the unit leaves writable): a directory the job's user owns, in a parent no tenant can
write, is the one layout where the job can create its socket, the agent can reach it, and
no other tenant can reach, replace or squat it. Tenants are not in group sco-agent. A
shared group-writable parent (0770, or setgid 2770 with every tenant in the group) lets any
tenant in the group connect to, delete or pre-empt another job's socket. No setgid bit is
needed (the unit's RestrictSUIDSGID= would refuse one): the socket's own mode is open, the
job's directory decides who reaches it.

`sync` runs every `job_dir_refresh_seconds` over the jobs the scheduler lists on the node:
missing directories are made, a directory left by an earlier owner of the same name is
replaced, and the directories of jobs that left are removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

DIR_MODE = 0o770


@dataclass
class SyncResult:
    made: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def _remove(path: Path) -> None:
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def _make(path: Path, uid: int) -> None:
    os.mkdir(path, 0o700)
    try:
        # Mode before owner: once the job's user owns it, the agent may no longer chmod.
        os.chmod(path, DIR_MODE)
        if os.lstat(path).st_uid != uid:
            os.chown(path, uid, -1)
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        raise


def sync(socket_dir: Path, wanted: Mapping[str, int | None]) -> SyncResult:
    """Make `socket_dir/<name>` for every name -> uid in `wanted`; remove every entry of a
    name not in it. A uid of None (a job whose user the scheduler does not say) leaves its
    entry as it is: nothing is made for it, and its socket is held to its directory's
    owner (agent.checkpoint.peer)."""
    result = SyncResult()
    present = {p.name: p for p in socket_dir.iterdir()} if socket_dir.is_dir() else {}
    for name, path in present.items():
        if name in wanted:
            st = os.lstat(path)
            uid = wanted[name]
            if uid is None or (stat.S_ISDIR(st.st_mode) and st.st_uid == uid):
                continue  # the job's own directory: keep it
        try:
            _remove(path)  # a job that left, or an earlier owner's directory of this name
            result.removed.append(name)
        except OSError as exc:
            result.failed[name] = f"cannot remove: {exc}"
    for name, uid in wanted.items():
        path = socket_dir / name
        if uid is None or (name in present and name not in result.removed):
            continue
        try:
            _make(path, uid)
            result.made.append(name)
        except OSError as exc:
            result.failed[name] = f"cannot make it for uid {uid}: {exc}"
    for name, why in result.failed.items():
        log.error("checkpoint directory %s: %s", socket_dir / name, why)
    return result
