"""Slurm resume request -> acquisition started, on a real slurmctld and Temporal's dev
server, through the shipped program (`deploy/slurm/sco-resume`: the shell wrapper, Python
start-up, `scontrol show node`, the job lookup, the bundle check, Temporal's start).

    .venv/bin/python bench/slurm_resume_bench.py [--trials 5] [--tiny]

Jobs of the ci-runners contract wanting 1, 8 and 32 CLOUD nodes are allocated powered-down
nodes (Slurm's own ResumeProgram is /bin/true here, so the jobs wait in CONFIGURING); the
benchmark then calls sco-resume with each job's hostlist, as slurmctld would, `--trials`
times, with and without a SLURM_RESUME_FILE. Measured per call: from the program's start
to the acquisition's start time in Temporal (`resume_to_started_s`), and the program's own
time after Python start-up (`in_program_s`: the Slurm reads and the fleet-state lookup of
the nodes' instances run concurrently with connecting to Temporal). Target <= 2 s (Slurm's
ResumeTimeout default is 60 s; the shipped fragment sets 600 s). No worker runs: the
acquisitions are started, not run, and terminated afterwards. A call that fails or times
out (60 s) is a measurement that did not happen (exit 1). Python's own start-up on this
machine is timed in the same run (`python -c pass`) as the anchor of the in-program share.
Prints one JSON report (bench/report.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.fleet.migrate import migrate
from bench.report import Report
from tests.support import services
from tests.support.control_harness import install_example_bundle
from tests.support.paths import BASE_DSN
from tests.support.slurm_burst_cluster import BurstCluster, burst_cluster
from workers.temporal_bootstrap import bootstrap_namespace

SIZES = (1, 8, 32)
TARGET_S = 2.0
NODES = 64
POOL = "r1.A.gp.l"


def submit(cluster: BurstCluster, size: int) -> str:
    out = cluster.run(
        "sbatch",
        "-N",
        str(size),
        "-p",
        "spot",
        "-A",
        "ci",
        "--comment=sco-contract=ci",
        "--wrap",
        "true",
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()[-1]


def hostlist_of(cluster: BurstCluster, job: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = cluster.run("squeue", "-h", "-j", job, "-o", "%T %N").stdout.split()
        if len(line) == 2 and line[0] == "CONFIGURING":
            return line[1]
        time.sleep(0.2)
    raise RuntimeError(f"job {job} not allocated: {cluster.run('squeue').stdout}")


class CallFailed(RuntimeError):
    """sco-resume did not start an acquisition."""


def python_startup_s(runs: int = 3) -> float:
    """The interpreter's bare start-up here and now: the floor under every call."""
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=30)
        best = min(best, time.perf_counter() - t)
    return best


async def one_call(
    client: Client, cluster: BurstCluster, job: str, hosts: str, resume_file: bool
) -> dict[str, float]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if resume_file:
        path = cluster.dir / "resume.json"
        path.write_text(json.dumps({"jobs": [{"job_id": int(job), "nodes": hosts}]}))
        env["SLURM_RESUME_FILE"] = str(path)
    t0 = time.time()
    proc = subprocess.run(  # noqa: ASYNC221 - the timing is the point; nothing else runs
        [str(cluster.dir / "sco-resume"), hosts],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    wall = time.time() - t0
    if proc.returncode != 0:
        raise CallFailed(f"sco-resume exited {proc.returncode}: {proc.stderr}{proc.stdout}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    [wid] = report["started"]
    desc = await client.get_workflow_handle(wid).describe()
    await client.get_workflow_handle(wid).terminate()
    assert desc.start_time is not None
    return {
        "resume_to_started_s": desc.start_time.timestamp() - t0,
        "program_wall_s": wall,
        "in_program_s": float(report["seconds"]),
    }


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values), 3),
        "max": round(max(values), 3),
        "min": round(min(values), 3),
    }


async def main(report: Report, trials: int, sizes: tuple[int, ...]) -> None:
    anchor = "sco-resume's start, as slurmctld runs it, to the acquisition's start in Temporal"
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        data_converter=pydantic_data_converter,
        ui=False,
    )
    tmp = Path(tempfile.mkdtemp(prefix="sco-resume-bench-"))
    # Fleet state: the program looks up the nodes' instances (one instance per node).
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    try:
        address = env.client.service_client.config.target_host
        await bootstrap_namespace(env.client, "bench-r1", timedelta(days=1))
        client = await Client.connect(
            address, namespace="bench-r1", data_converter=pydantic_data_converter
        )
        cache, trust = install_example_bundle(tmp)
        (tmp / "sco.toml").write_text("")
        sco_env = {
            "SCO_PYTHON": sys.executable,
            "SCO_HOME": str(ROOT),
            "SCO_CONFIG": str(tmp / "sco.toml"),
            "SCO_REGION": "r1",
            "SCO_REGIONS_DIR": str(ROOT / "deploy" / "regions"),
            "SCO_TEMPORAL__ADDRESS": address,
            "SCO_POSTGRES_DSN": dsn,
            "SCO_TEMPORAL__NAMESPACE_PREFIX": "bench-",
            "SCO_CONTRACTS__CACHE_DIR": str(cache),
            "SCO_CONTRACTS__TRUST_DIR": str(trust),
        }
        nodes = {f"r1-a-gp-l-{i:03d}": POOL for i in range(1, NODES + 1)}
        results: dict[str, object] = {}
        calls: list[dict[str, float]] = []
        with burst_cluster(nodes, sco_env, programs=False, resume_timeout=600) as cluster:
            jobs = {size: submit(cluster, size) for size in sizes}
            hosts = {size: hostlist_of(cluster, job) for size, job in jobs.items()}
            for size in sizes:
                for resume_file in (True, False):
                    key = f"{size}_nodes_{'resume_file' if resume_file else 'squeue'}"
                    try:
                        these = [
                            await one_call(client, cluster, jobs[size], hosts[size], resume_file)
                            for _ in range(trials)
                        ]
                    except (CallFailed, subprocess.TimeoutExpired) as exc:
                        report.measurement_missing(
                            "resume_to_started_worst",
                            f"{key}: {exc}"[:300],
                            "s",
                            anchor=anchor,
                            target=TARGET_S,
                            comparator="<=",
                        )
                        return
                    calls += these
                    results[key] = {name: summary([c[name] for c in these]) for name in these[0]}
        started = [c["resume_to_started_s"] for c in calls]
        report.figure("resume_to_started_p50", statistics.median(started), "s", anchor=anchor)
        report.figure(
            "resume_to_started_worst",
            max(started),
            "s",
            anchor=f"{anchor}; {len(started)} calls, {', '.join(map(str, sizes))} nodes",
            target=TARGET_S,
            comparator="<=",
        )
        report.figure(
            "in_program_p50",
            statistics.median(c["in_program_s"] for c in calls),
            "s",
            anchor=f"the program's own work after start-up (bare Python: "
            f"{python_startup_s():.2f} s in this run)",
        )
        report.details["results"] = results
    finally:
        await env.shutdown()
        services.drop_database(dsn)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="one call per mode, 1-node job")
    args = parser.parse_args()
    sizes = (1,) if args.tiny else SIZES
    trials = 1 if args.tiny else args.trials
    rep = Report("slurm_resume", {"trials": trials, "sizes": list(sizes), "nodes": NODES})
    asyncio.run(main(rep, trials, sizes))
    raise SystemExit(rep.emit())
