"""A real Slurm with SCO's power saving: munged + slurmctld whose CLOUD nodes call the
ResumeProgram, SuspendProgram and ResumeFailProgram shipped in deploy/slurm/.

The slurm.conf is the shipped `deploy/slurm/slurm.conf.fragment` (program paths pointed at
copies of the programs in the test's directory, times shortened) plus one CLOUD node per
name in `nodes`, each with the features `sco slurm conf` writes. The programs read their
settings from `sco.env` beside them, as in production from /etc/sco/slurm.env.

"Booting" an instance is the one thing a single machine cannot do: `boot(node)` starts a
slurmd for the node on loopback, as the instance's cloud-init would; `power_off(node)`
stops it, as deleting the instance would. One slurmd per machine (Debian's Slurm is built
without multiple-slurmd support), so at most one node is up at a time.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from activities.demand.slurm_resume import feature_list
from contracts.pool_id import PoolId
from tests.support import tools
from tests.support.paths import REPO
from tests.support.slurm_cluster import (
    COMMON_CONF,
    SLURMD_CONF,
    SlurmCluster,
    _stop,
    check_tools,
    start_controller,
)

PROGRAMS = ("sco-power", "sco-resume", "sco-suspend", "sco-resume-fail")

_BASE = "ClusterName=sco-burst-test\n" + COMMON_CONF + SLURMD_CONF


def fragment(
    directory: Path, *, resume_timeout: int, suspend_time: int | None, programs: bool = True
) -> str:
    """The shipped fragment with this directory's programs and test-sized times;
    `programs=False`: Slurm calls /bin/true instead (benchmarks call them by hand);
    `suspend_time=None` keeps the shipped global SuspendTime (INFINITE: partitions set it)."""
    text = (REPO / "deploy" / "slurm" / "slurm.conf.fragment").read_text()
    if programs:
        text = text.replace("/usr/lib/sco/slurm/", f"{directory}/")
    else:
        for name in ("sco-resume-fail", "sco-resume", "sco-suspend"):
            text = text.replace(f"/usr/lib/sco/slurm/{name}", "/bin/true")
    out = []
    for line in text.splitlines():
        key = line.split("=", 1)[0]
        if key == "ResumeTimeout":
            line = f"ResumeTimeout={resume_timeout}"
        elif key == "SuspendTime" and suspend_time is not None:
            line = f"SuspendTime={suspend_time}"
        elif key == "SuspendTimeout":
            line = "SuspendTimeout=5"
        elif key == "SlurmctldParameters":
            # The power-save thread looks every second instead of every ten.
            line += ",power_save_interval=1,power_save_min_interval=0"
        out.append(line)
    return "\n".join(out) + "\n"


class BurstCluster(SlurmCluster):
    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.slurmd: dict[str, subprocess.Popen[bytes]] = {}

    def boot(self, node: str) -> None:
        if node in self.slurmd:
            return
        with (self.dir / f"slurmd-{node}.out").open("wb") as out:
            self.slurmd[node] = subprocess.Popen(
                # -b: report a boot now. slurmctld accepts a POWERING_UP node only when its
                # boot time is newer than the resume request; a real instance just booted.
                ["slurmd", "-D", "-b", "-N", node, "-f", str(self.conf)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def power_off(self, node: str) -> None:
        proc = self.slurmd.pop(node, None)
        if proc is not None:
            _stop(proc)

    def node_state(self, node: str) -> str:
        return self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T").stdout.strip().lower()

    def power_log(self) -> str:
        path = self.dir / "sco-power.log"
        return path.read_text() if path.exists() else ""


@contextmanager
def burst_cluster(
    nodes: Mapping[str, str],
    sco_env: Mapping[str, str],
    *,
    resume_timeout: int = 60,
    suspend_time: int = 5,
    start_timeout: float = 30,
    programs: bool = True,
) -> Iterator[BurstCluster]:
    """`nodes`: node name -> pool id (region r1), all in partition `spot`. `sco_env`: the
    SCO_* settings the programs get (SLURM_CONF and the log file are added here)."""
    check_tools(tools.SLURMCTLD_SLURMD)
    directory = Path(tempfile.mkdtemp(prefix="sco-burst-"))
    procs: list[subprocess.Popen[bytes]] = []
    cluster: BurstCluster | None = None
    try:
        for name in PROGRAMS:
            shutil.copy2(REPO / "deploy" / "slurm" / name, directory / name)
        # CPUs: what slurmd finds here, or the node registers as too small and drains.
        cpus = os.cpu_count() or 1
        node_lines = []
        for node, pool_id in nodes.items():
            pid = PoolId.parse(pool_id)
            features = ",".join(feature_list(pool_id, pid.hall, pid.sku, pid.size, "reclaimable"))
            node_lines.append(
                f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname={node} CPUs={cpus} "
                f"RealMemory=500 Features={features} State=CLOUD"
            )
        conf = (
            _BASE
            + fragment(
                directory,
                resume_timeout=resume_timeout,
                suspend_time=suspend_time,
                programs=programs,
            )
            + "\n".join(node_lines)
            + f"\nPartitionName=spot Nodes={','.join(nodes)} Default=YES MaxTime=60 State=UP\n"
        )
        env = {
            **sco_env,
            "SCO_SLURM__SLURM_CONF": str(directory / "slurm.conf"),
            "SCO_SLURM__LOG_FILE": str(directory / "sco-power.log"),
        }
        (directory / "sco.env").write_text(
            "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items())
        )
        base = start_controller(directory, conf, procs, start_timeout)
        cluster = BurstCluster(base.dir)
        yield cluster
    finally:
        if cluster is not None:
            for node in list(cluster.slurmd):
                cluster.power_off(node)
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(directory, ignore_errors=True)
