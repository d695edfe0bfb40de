"""A real, throwaway Slurm controller for admission tests: munged + slurmctld, no systemd.

Everything lives in one temporary directory (munge key and socket, slurm.conf,
job_submit.lua, state, logs) and both daemons are stopped by process id at the end. There is
no slurmd: the `spot` partition is CLOUD nodes whose ResumeProgram does nothing and the
`batch` node never answers, so accepted jobs stay pending and nothing ever runs.

Needs the Debian packages slurmctld, slurm-client and munge (`make deps`; tests ask for them
with `tools.require(*tools.SLURMCTLD)` before starting one).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import tools
from tests.support.services import free_port
from tests.support.wait import WaitTimeout, eventually

#: What every test cluster's slurm.conf holds: our own munged, state and logs in the test's
#: directory, no accounting database. Each cluster adds its name, nodes and partitions.
COMMON_CONF = """\
# slurmctld only runs where SlurmctldHost names this host; the address pins it to loopback.
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Clients read this too, so sbatch and scontrol reach our munged rather than the system's.
AuthInfo=socket={munge_socket}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmctldDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# No slurmdbd: job_submit still sees the account a job names with --account.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
"""

#: The lines a cluster with a slurmd adds: its log, and nodes return to service on their own.
SLURMD_CONF = """\
SlurmdLogFile={dir}/slurmd.log
SlurmdDebug=info
ReturnToService=2
# The scheduler looks every second, not every minute.
SchedulerParameters=sched_interval=1
"""

_SLURM_CONF = (
    "ClusterName=sco-test\n"
    + COMMON_CONF
    + """\
# Loads job_submit.lua from this file's directory.
JobSubmitPlugins=lua
# CLOUD nodes are "resumed" by a program that does nothing: accepted jobs just wait.
ResumeProgram=/bin/true
SuspendProgram=/bin/true
SuspendTime=600
ResumeTimeout=600
NodeName=spot[1-2] CPUs=2 RealMemory=1000 State=CLOUD
NodeName=batch1 NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=spot Nodes=spot[1-2] MaxTime=60 State=UP
PartitionName=batch Nodes=batch1 Default=YES MaxTime=60 State=UP
"""
)


class SlurmCluster:
    """A running controller; `run` executes a Slurm client command against it."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.conf = directory / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def log(self) -> str:
        path = self.dir / "slurmctld.log"
        return path.read_text(errors="replace") if path.exists() else ""


class ToolsMissing(Exception):
    """A cluster was asked for without the tools it runs (callers outside pytest: bench)."""


def check_tools(names: tuple[str, ...]) -> None:
    if gone := tools.missing(names):
        raise ToolsMissing(tools.skip_reason(gone))


@contextmanager
def slurm_cluster(job_submit_lua: str, *, start_timeout: float = 30) -> Iterator[SlurmCluster]:
    """Start munged and slurmctld with `job_submit_lua`; stop both and clean up after."""
    check_tools(tools.SLURMCTLD)
    directory = Path(tempfile.mkdtemp(prefix="sco-slurm-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        cluster = start_controller(
            directory,
            _SLURM_CONF,
            procs,
            start_timeout,
            files={"job_submit.lua": job_submit_lua},
        )
        yield cluster
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(directory, ignore_errors=True)


def start_controller(
    directory: Path,
    conf_template: str,
    procs: list[subprocess.Popen[bytes]],
    start_timeout: float,
    *,
    files: dict[str, str] | None = None,
    **fields: str,
) -> SlurmCluster:
    """munged and slurmctld in `directory` with `conf_template` filled in; every process
    started is appended to `procs` (the caller stops them, in reverse)."""
    # munged refuses a socket directory that other users cannot traverse.
    directory.chmod(0o755)
    cluster = SlurmCluster(directory)
    munge_socket = directory / "munge.socket"
    procs.append(_start_munged(directory, munge_socket))
    for sub in ("state", "spool"):
        (directory / sub).mkdir()
    cluster.conf.write_text(
        conf_template.format(
            host=socket.gethostname().split(".")[0],
            ctld_port=free_port(),
            slurmd_port=free_port(),
            munge_socket=munge_socket,
            dir=directory,
            **fields,
        )
    )
    for name, text in (files or {}).items():
        (directory / name).write_text(text)
    with (directory / "slurmctld.out").open("wb") as out:
        # -D: foreground, so the pid is ours to stop; -c: no state from earlier runs.
        procs.append(
            subprocess.Popen(
                ["slurmctld", "-D", "-c", "-f", str(cluster.conf)],
                env=cluster.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        )
    _wait_until_up(cluster, procs[-1], start_timeout)
    return cluster


def _start_munged(directory: Path, sock: Path) -> subprocess.Popen[bytes]:
    key = directory / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    out = directory / "munged.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [
                "munged",
                "--foreground",
                "--force",  # a lax /tmp (group-writable, no sticky bit) warns instead of failing
                f"--socket={sock}",
                f"--key-file={key}",
                f"--log-file={directory / 'munged.log'}",
                f"--pid-file={directory / 'munged.pid'}",
                f"--seed-file={directory / 'munged.seed'}",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"munged exited {proc.returncode}")
        return sock.exists()

    try:
        eventually(up, timeout=10, what=f"munged's socket {sock}", retrying=())
    except (RuntimeError, WaitTimeout) as exc:
        _stop(proc)
        raise RuntimeError(
            f"munged did not start ({exc}): {out.read_text(errors='replace')}"
        ) from exc
    return proc


def _wait_until_up(cluster: SlurmCluster, proc: subprocess.Popen[bytes], timeout: float) -> None:

    def up() -> bool:
        if proc.poll() is not None:
            out = (cluster.dir / "slurmctld.out").read_text(errors="replace")
            raise RuntimeError(f"slurmctld exited {proc.returncode}:\n{out}\n{cluster.log()}")
        return cluster.run("scontrol", "ping", timeout=10).returncode == 0

    try:
        eventually(up, timeout=timeout, what="slurmctld answering scontrol ping", retrying=())
    except WaitTimeout as exc:
        raise RuntimeError(f"slurmctld not up ({exc}):\n{cluster.log()}") from exc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
