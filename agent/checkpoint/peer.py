"""Who is at the other end of a checkpoint socket: SO_PEERCRED, checked on both ends.

The agent talks to a job only when the job's directory, the socket in it and the process
listening on it (uid and gid from SO_PEERCRED, taken by the kernel at listen()) all belong
to the job's owner as its scheduler names it, and, where the scheduler names a cgroup
(a pod's uid), when that process runs in it. A squatter answering under another job's name
is refused: its answer is never recorded, and the job is forced.

The workload answers only the node agent: a peer whose uid is root, its own, or the owner
of the socket directory's parent (the agent's `socket_dir`, created by systemd for the
agent's user).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class PeerRefused(Exception):
    """The socket, its directory or the process behind it is not the job's."""


@dataclass(frozen=True)
class PeerCredentials:
    pid: int
    uid: int
    gid: int


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return PeerCredentials(pid, uid, gid)


@dataclass(frozen=True)
class JobOwner:
    """What the scheduler says a job runs as. `uid` None: whoever owns the job's directory
    (the `none` scheduler, where the directory is the job); `gid` None: any group;
    `cgroup_markers`: one of them must appear in /proc/<pid>/cgroup of the peer."""

    uid: int | None = None
    gid: int | None = None
    cgroup_markers: tuple[str, ...] = field(default_factory=tuple)


def check_path(path: Path, owner: JobOwner) -> int:
    """The uid the peer must have; PeerRefused unless the job's directory and its socket
    are what they should be (no symlinks, owned by the job's user)."""
    directory = path.parent
    try:
        dir_st = os.lstat(directory)
        sock_st = os.lstat(path)
    except FileNotFoundError as exc:
        raise PeerRefused(f"{exc.filename} does not exist") from None
    if not stat.S_ISDIR(dir_st.st_mode):
        raise PeerRefused(f"{directory} is not a directory")
    if not stat.S_ISSOCK(sock_st.st_mode):
        raise PeerRefused(f"{path} is not a socket")
    expected = dir_st.st_uid if owner.uid is None else owner.uid
    if dir_st.st_uid != expected:
        raise PeerRefused(f"{directory} is owned by uid {dir_st.st_uid}, the job by {expected}")
    if dir_st.st_mode & stat.S_IWOTH:
        raise PeerRefused(f"{directory} is writable by anyone")
    if sock_st.st_uid != expected:
        raise PeerRefused(f"{path} is owned by uid {sock_st.st_uid}, the job by {expected}")
    return expected


def check_peer(
    peer: PeerCredentials, uid: int, owner: JobOwner, proc: Path = Path("/proc")
) -> None:
    """PeerRefused unless the listening process is the job's."""
    if peer.uid != uid:
        raise PeerRefused(f"the socket is served by uid {peer.uid}, the job runs as {uid}")
    if owner.gid is not None and peer.gid != owner.gid:
        raise PeerRefused(f"the socket is served by gid {peer.gid}, the job's is {owner.gid}")
    if owner.cgroup_markers:
        try:
            cgroups = (proc / str(peer.pid) / "cgroup").read_text()
        except OSError as exc:
            raise PeerRefused(f"cannot read the cgroup of pid {peer.pid}: {exc}") from None
        if not any(marker in cgroups for marker in owner.cgroup_markers):
            raise PeerRefused(f"pid {peer.pid} does not run in the job's cgroup")


def agent_uids(path: Path) -> frozenset[int]:
    """The peers a workload answers: root, itself, and the owner of the socket dir (the
    directory that holds the job directories: the agent's, as the unit creates it)."""
    allowed = {0, os.geteuid()}
    with contextlib.suppress(OSError):
        allowed.add(os.stat(path.parent.parent).st_uid)
    return frozenset(allowed)
