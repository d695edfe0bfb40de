"""A real one-node Slurm for the node agent's tests: munged + slurmctld + slurmd.

Extends tests/slurm_cluster.py: the same throwaway directory and stop-by-pid discipline,
plus a slurmd that registers one node (`NODE`) on loopback, so jobs really run and can be
drained and requeued. Needs the Debian packages slurmctld, slurmd, slurm-client, munge
(`tools.SLURMCTLD_SLURMD`).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import tools
from tests.support.slurm_cluster import (
    COMMON_CONF,
    SLURMD_CONF,
    SlurmCluster,
    _stop,
    check_tools,
    start_controller,
)
from tests.support.wait import WaitTimeout, eventually

NODE = "agentnode1"

_SLURM_CONF = (
    "ClusterName=sco-agent-test\n"
    + COMMON_CONF
    + SLURMD_CONF
    + """\
JobRequeue=1
NodeName={node} NodeAddr=127.0.0.1 NodeHostname={node} CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=spot Nodes={node} Default=YES MaxTime=60 State=UP
"""
)


@contextmanager
def agent_slurm_cluster(*, start_timeout: float = 20) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd for `NODE`; stop all three and clean up after.

    Raises RuntimeError with the daemons' logs when any of them does not come up; tests
    turn that into a skip.
    """
    check_tools(tools.SLURMCTLD_SLURMD)
    directory = Path(tempfile.mkdtemp(prefix="sco-agent-slurm-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        cluster = start_controller(directory, _SLURM_CONF, procs, start_timeout, node=NODE)
        with (directory / "slurmd.out").open("wb") as out:
            # -N: this slurmd is NODE whatever the host is called; -D: foreground.
            procs.append(
                subprocess.Popen(
                    ["slurmd", "-D", "-N", NODE, "-f", str(cluster.conf)],
                    env=cluster.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        _wait_node_idle(cluster, procs[-1], start_timeout)
        yield cluster
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(directory, ignore_errors=True)


def node_state(cluster: SlurmCluster) -> str:
    out = cluster.run("sinfo", "-h", "-N", "-n", NODE, "-o", "%T").stdout.strip()
    return out.lower()


def _wait_node_idle(cluster: SlurmCluster, proc: subprocess.Popen[bytes], timeout: float) -> None:
    log = cluster.dir / "slurmd.log"

    def idle() -> bool:
        if proc.poll() is not None:
            out = (cluster.dir / "slurmd.out").read_text(errors="replace")
            raise RuntimeError(
                f"slurmd exited {proc.returncode}:\n{out}\n"
                f"{log.read_text(errors='replace') if log.exists() else ''}"
            )
        return node_state(cluster) == "idle"

    try:
        eventually(idle, timeout=timeout, what=f"node {NODE} idle", retrying=())
    except WaitTimeout as exc:
        raise RuntimeError(
            f"{exc} (state {node_state(cluster)!r}):\n"
            f"{log.read_text(errors='replace') if log.exists() else ''}"
        ) from exc
