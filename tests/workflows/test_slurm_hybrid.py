"""A hybrid cluster on a real slurmctld with the shipped slurm.conf fragment: the site's own
(local) nodes and SCO's CLOUD nodes share a partition. Jobs land on local nodes first (CLOUD
nodes carry `sco slurm conf`'s higher Weight); only the CLOUD partition suspends (global
SuspendTime=INFINITE, the partition's own short SuspendTime): an idle CLOUD node is handed
to the shipped sco-suspend, and the local nodes, idle or down all along, never are.

SCO's control plane behind the power programs is a recorder here (SCO_PYTHON in sco.env):
what is tested is which nodes slurmctld hands to which program."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import tools
from tests.support.paths import REPO
from tests.support.slurm_burst_cluster import _BASE, PROGRAMS, fragment
from tests.support.slurm_cluster import SlurmCluster, _stop, start_controller
from tests.support.wait import WaitTimeout, eventually
from workers.cli.schedulers import CLOUD_NODE_WEIGHT

pytestmark = [pytest.mark.timeout(240), pytest.mark.tools(*tools.SLURMCTLD_SLURMD)]

CLOUD_SUSPEND_SECONDS = 3
RECORDER = """#!/bin/sh
# Stands in for SCO's python: records `-m workers.slurm_power_programs VERB HOSTLIST`.
echo "$*" >> "{log}"
"""


class Hybrid(SlurmCluster):
    slurmd: subprocess.Popen[bytes] | None = None

    def boot(self, node: str) -> None:
        """The machine's one slurmd (Debian's Slurm has no multiple-slurmd), as `node`."""
        self.stop_slurmd()
        with (self.dir / f"slurmd-{node}.out").open("wb") as out:
            self.slurmd = subprocess.Popen(
                ["slurmd", "-D", "-b", "-N", node, "-f", str(self.conf)],
                env=self.env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def stop_slurmd(self) -> None:
        if self.slurmd is not None:
            _stop(self.slurmd)
            self.slurmd = None

    def state(self, node: str) -> str:
        return self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T").stdout.strip().lower()

    def calls(self) -> list[str]:
        path = self.dir / "calls.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return [line.removeprefix("-m workers.slurm_power_programs ") for line in lines]

    def job(self, job_id: str) -> str:
        return self.run("scontrol", "show", "job", job_id, "-o").stdout


def wait_for(what: str, done: Callable[[], bool], cluster: Hybrid, within: float = 90) -> None:
    try:
        eventually(done, timeout=within, what=what, every=0.25, retrying=())
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}; calls {cluster.calls()}\n{cluster.log()[-3000:]}") from exc


@pytest.fixture
def hybrid() -> Iterator[Hybrid]:
    yield from _hybrid(None)


@pytest.fixture
def global_suspend() -> Iterator[Hybrid]:
    """The defect this guards against: SuspendTime set globally (as before)."""
    yield from _hybrid(CLOUD_SUSPEND_SECONDS)


def _hybrid(global_suspend_time: int | None) -> Iterator[Hybrid]:
    directory = Path(tempfile.mkdtemp(prefix="sco-hybrid-"))
    procs: list[subprocess.Popen[bytes]] = []
    cluster: Hybrid | None = None
    try:
        for name in PROGRAMS:
            shutil.copy2(REPO / "deploy" / "slurm" / name, directory / name)
        recorder = directory / "record-python"
        recorder.write_text(RECORDER.format(log=directory / "calls.log"))
        recorder.chmod(0o755)
        (directory / "sco.env").write_text(f"SCO_PYTHON={recorder}\n")
        cpus = os.cpu_count() or 1
        node = f"NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=500"
        conf = (
            _BASE
            # The shipped fragment, global SuspendTime kept (INFINITE).
            + fragment(directory, resume_timeout=60, suspend_time=global_suspend_time)
            + f"NodeName=local[1-2] {node} State=UNKNOWN\n"  # the site's: default Weight=1
            + f"NodeName=cloud[1-2] {node} State=CLOUD Weight={CLOUD_NODE_WEIGHT}\n"
            + "PartitionName=batch Nodes=local[1-2],cloud[1-2] Default=YES MaxTime=60 State=UP\n"
            + f"PartitionName=sco-spot Nodes=cloud[1-2] SuspendTime={CLOUD_SUSPEND_SECONDS} "
            "MaxTime=60 State=UP\n"
        )
        try:
            base = start_controller(directory, conf, procs, 30)
        except RuntimeError as exc:
            pytest.skip(f"slurmctld did not start here: {exc}")
        cluster = Hybrid(base.dir)
        yield cluster
    finally:
        if cluster is not None:
            cluster.stop_slurmd()
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(directory, ignore_errors=True)


def test_shipped_fragment_keeps_suspend_off_globally() -> None:
    text = (REPO / "deploy" / "slurm" / "slurm.conf.fragment").read_text()
    assert "\nSuspendTime=INFINITE\n" in text


def test_jobs_go_to_local_nodes_first_and_only_cloud_nodes_are_suspended(hybrid: Hybrid) -> None:
    start = time.monotonic()
    hybrid.boot("local1")
    wait_for("local1 to register", lambda: hybrid.state("local1") == "idle", hybrid)

    # Weight: local1 (1) before any CLOUD node (1000), though both are free in `batch`.
    out = hybrid.run("sbatch", "-p", "batch", "-o", "/dev/null", "--wrap", "true")
    assert out.returncode == 0, out.stderr
    local_job = out.stdout.split()[-1]
    wait_for("the batch job to finish", lambda: "JobState=COMPLETED" in hybrid.job(local_job),
             hybrid)  # fmt: skip
    assert " NodeList=local1 " in hybrid.job(local_job)
    assert not [c for c in hybrid.calls() if c.startswith("resume")]  # no CLOUD node needed

    # A job for the CLOUD partition: slurmctld resumes a CLOUD node (sco-resume), "boots" it.
    out = hybrid.run("sbatch", "-p", "sco-spot", "-o", "/dev/null", "--wrap", "true")
    assert out.returncode == 0, out.stderr
    cloud_job = out.stdout.split()[-1]
    wait_for("sco-resume", lambda: any(c.startswith("resume ") for c in hybrid.calls()), hybrid)
    [resumed] = [c.split()[1] for c in hybrid.calls() if c.startswith("resume ")]
    assert resumed in {"cloud1", "cloud2"}
    hybrid.boot(resumed)  # local1's slurmd stops: from here local1 is idle, then not responding
    wait_for("the cloud job to finish", lambda: "JobState=COMPLETED" in hybrid.job(cloud_job),
             hybrid)  # fmt: skip
    done = time.monotonic()

    # Idle for the partition's SuspendTime: slurmctld hands it to sco-suspend.
    wait_for("sco-suspend", lambda: f"suspend {resumed}" in hybrid.calls(), hybrid)
    hybrid.stop_slurmd()  # the instance is gone
    # Local nodes have been idle (or down) far longer than the CLOUD SuspendTime; give the
    # power-save thread (every 1 s) several more rounds to get them wrong.
    # sleep is the behaviour under test: nothing local is suspended over several rounds
    time.sleep(max(0.0, 3 * CLOUD_SUSPEND_SECONDS - (time.monotonic() - done)))
    assert time.monotonic() - start > 3 * CLOUD_SUSPEND_SECONDS
    suspended = [c for c in hybrid.calls() if c.startswith("suspend ")]
    assert suspended and all("local" not in c for c in suspended), hybrid.calls()
    for node in ("local1", "local2"):
        state = hybrid.state(node)
        assert "power" not in state and "~" not in state, (node, state)


def test_probe_a_global_suspend_time_would_power_down_the_local_nodes(
    global_suspend: Hybrid,
) -> None:
    """The check above has teeth: with SuspendTime global, an idle local node is handed to
    sco-suspend (which would find no instance, and sco-resume would later mark it DOWN)."""
    global_suspend.boot("local1")
    wait_for("local1 to register", lambda: global_suspend.state("local1") == "idle",
             global_suspend)  # fmt: skip
    wait_for(
        "a local node handed to sco-suspend",
        lambda: any(c.startswith("suspend ") and "local" in c for c in global_suspend.calls()),
        global_suspend,
        within=60,
    )
