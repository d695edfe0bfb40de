"""The real control plane at scale: what ONE region worker process sustains, and where it
saturates.

    .venv/bin/python bench/saturation_bench.py [--start 30] [--factor 2] [--steps 7]
        [--step-seconds 60] [--p99-bound 15] [--out bench/results] [--tiny]

Real services, real processes: Temporal's dev server (a process of this bench), the
machine's PostgreSQL (a scratch database), `sco sim serve` (the simulated cloud, boot 0 s,
no API latency) and `sco worker --region r1` (the region worker, controllers off, a token
budget far above the offered rate so the budget is not what limits). The bench offers, per
step, open-loop (on a schedule, whatever completes):
- acquisitions/min: one-instance AcquisitionWorkflow runs on the worker's queue, timed
  from start to result;
- notices/min (half the acquisition rate): what the control plane does for a reclaim
  notice, i.e. the NOTICE write in fleet state and the exclusion hook (signal-with-start
  of the pool's PoolExclusionWorkflow, served by the worker; made by the region worker's
  notice hooks since decision 0030, here by the bench's own client), timed
  write + signal; at the step's end every touched pool's exclusion workflow is queried
  (served by the worker) for the notices it holds, so a notice counts as achieved only
  once the worker has applied it.
Publishing notices to NATS and the agents are not in this bench (bench/hall_fanout_bench.py).
The offered rate doubles (`--factor`) until a step saturates: achieved < 90 % of offered,
or the acquisition p99 above `--p99-bound`, or the step's work not done within
step + 2 x bound. Per step: offered, achieved, p50/p99, instances under management
(ACTIVE in fleet state) and CPU % (of one core) of the worker, the simulator, the dev
server and the scratch database's PostgreSQL backends, from /proc. The curve is the JSON
report's details and a PNG in --out (saturation.png). With `--workers N`, N `sco worker`
processes share the region's task queues (Temporal's way to scale a region past one
worker): the same ramp, their CPU summed, reported as `saturation_N_workers`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.events import EventKind, InstanceState
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from bench.report import Report
from contracts.pool_id import PoolId
from contracts.region import Region, load_region
from tests.support import services
from tests.support.paths import BASE_DSN
from tests.support.sco_process import Process
from workers import procstat
from workers.exit_now import run_and_exit
from workers.temporal_bootstrap import bootstrap_namespace, ensure_search_attributes
from workflows.acquisition.models import AcquisitionInput, LaunchItem
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.exclusion.client import notify_reclaim
from workflows.exclusion.models import exclusion_workflow_id
from workflows.exclusion.workflow import PoolExclusionWorkflow

REGION = "r1"
QUEUE = f"sco-{REGION}"  # the worker's queue (TemporalSettings.task_queue)
SATURATED_FRACTION = 0.9


@dataclass
class Step:
    offered_acq_per_min: float
    offered_notices_per_min: float
    achieved_acq_per_min: float = 0.0
    achieved_notices_per_min: float = 0.0
    acq_p50_s: float | None = None
    acq_p99_s: float | None = None
    notice_p50_s: float | None = None
    notice_p99_s: float | None = None
    instances_under_management: int = 0
    cpu_pct: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds over the step
    acquisitions_done: int = 0
    notices_done: int = 0
    saturated: str = ""  # why, or empty


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))], 3)


class Slots:
    """Pools in turn, each up to what it lends: one instance per acquisition."""

    def __init__(self, region: Region) -> None:
        self._left = {region.pool_id(p): p.reclaimable_units for p in region.pools if not p.gpus}
        self._turn = itertools.cycle(list(self._left))

    def take(self, n: int = 1) -> str:
        for _ in range(len(self._left)):
            pid = next(self._turn)
            if self._left[pid] >= n:
                self._left[pid] -= n
                return pid
        raise RuntimeError(f"no pool of {REGION} lends {n} more instances")


def acquisition(pid: str, n: int, tag: str) -> AcquisitionInput:
    pool = PoolId.parse(pid)
    return AcquisitionInput(
        region=REGION,
        contract=f"sat-{tag}",
        tier=3,
        items=[LaunchItem(pool_id=pid, hall=pool.hall, flavor=pool.flavor, instances=n, units=n)],
    )


class Load:
    def __init__(self, client: Client, fleet: FleetRepository, slots: Slots, dsn: str) -> None:
        self.client, self.fleet, self.slots, self.dsn = client, fleet, slots, dsn
        self.noticed: set[str] = set()
        self.pools_noticed: set[str] = set()

    async def acquire(self, n: int = 1) -> tuple[float, float]:
        pid = self.slots.take(n)
        tag = uuid.uuid4().hex[:10]
        t = time.perf_counter()
        await self.client.execute_workflow(
            AcquisitionWorkflow.run,
            acquisition(pid, n, tag),
            id=f"acq-{REGION}-sat-{tag}",
            task_queue=QUEUE,
        )
        return t, time.perf_counter()

    async def notice(self, iid: str, pool_id: str) -> tuple[float, float]:
        t = time.perf_counter()
        await asyncio.to_thread(self.fleet.record_event, iid, EventKind.NOTICE, reason="bench")
        await notify_reclaim(self.client, REGION, QUEUE, pool_id, iid, datetime.now(UTC))
        self.pools_noticed.add(pool_id)
        return t, time.perf_counter()

    def active(self) -> list[tuple[str, str]]:
        rows = self.fleet.list_instances(REGION, [InstanceState.ACTIVE])
        return [(r.instance_id, r.pool_id) for r in rows if r.instance_id not in self.noticed]

    async def applied_notices(self, bound_s: float) -> int | None:
        """Notices the exclusion workflows hold (each query is answered by the worker)."""

        async def one(pool_id: str) -> int:
            handle = self.client.get_workflow_handle(exclusion_workflow_id(pool_id))
            st = await handle.query(PoolExclusionWorkflow.status)
            return st.notices_in_window

        try:
            got = await asyncio.wait_for(
                asyncio.gather(*(one(p) for p in sorted(self.pools_noticed))), bound_s
            )
        except TimeoutError:
            return None
        return sum(got)

    def backend_pids(self) -> list[int]:
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            ).fetchall()
        return [int(r[0]) for r in rows]


def achieved_per_min(times: list[tuple[float, float]], t0: float, seconds: float) -> float:
    """Completions per minute: n over the span from the step's start to the last
    completion less the fastest latency (the service time without a queue). A worker that
    keeps up finishes its last job about one service time after the step: the span is the
    step; a backlog stretches it."""
    if not times:
        return 0.0
    fastest = min(end - start for start, end in times)
    span = max(seconds, max(end for _, end in times) - t0 - fastest)
    return len(times) * 60 / span


async def scheduled(
    count: int, per_s: float, job: Callable[[int], Coroutine[Any, Any, None]]
) -> None:
    """Start `job(i)` on schedule (open loop), then wait for them all."""
    started = time.perf_counter()
    tasks = []
    for i in range(count):
        delay = started + i / per_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(job(i)))
    await asyncio.gather(*tasks)


async def run_step(
    load: Load, procs: dict[str, list[int]], acq_per_min: float, seconds: float, bound_s: float
) -> Step:
    n_acq = max(1, round(acq_per_min * seconds / 60))
    candidates = load.active()
    n_notice = min(len(candidates), max(1, round(acq_per_min / 2 * seconds / 60)))
    step = Step(acq_per_min, n_notice * 60 / seconds)
    targets = candidates[:n_notice]
    load.noticed.update(i for i, _ in targets)
    held_before = await load.applied_notices(bound_s) if load.pools_noticed else 0
    pg = load.backend_pids()
    before = {name: procstat.snapshot(pids) for name, pids in procs.items()}
    before["postgres"] = procstat.snapshot(pg)
    # Each job records its (start, end) as it completes: a step cut off by its bound
    # still reports what got done, and the CPU it took.
    acq_done: list[tuple[float, float]] = []
    notice_done: list[tuple[float, float]] = []
    failed: list[BaseException] = []

    async def timed(
        job: Callable[[], Awaitable[tuple[float, float]]], into: list[tuple[float, float]]
    ) -> None:
        try:
            into.append(await job())
        except Exception as exc:  # a failed acquisition or signal is a saturation sign
            failed.append(exc)

    t0 = time.perf_counter()
    acq = scheduled(n_acq, n_acq / seconds, lambda i: timed(load.acquire, acq_done))
    notices = scheduled(
        n_notice,
        n_notice / seconds,
        lambda i: timed(lambda: load.notice(*targets[i]), notice_done),
    )
    cut = ""
    try:
        await asyncio.wait_for(asyncio.gather(acq, notices), seconds + 2 * bound_s)
    except TimeoutError:
        cut = (
            f"the step's work not done within {seconds + 2 * bound_s:.0f} s "
            f"({len(acq_done)}/{n_acq} acquisitions, {len(notice_done)}/{n_notice} notices)"
        )
    held_after = await load.applied_notices(bound_s)
    wall = max(seconds, time.perf_counter() - t0)
    for name, pids in procs.items():
        step.cpu_s[name] = round(procstat.cpu_delta(before[name], pids), 3)
        step.cpu_pct[name] = round(100 * step.cpu_s[name] / wall, 1)
    step.acquisitions_done, step.notices_done = len(acq_done), len(notice_done)
    pg_now = sorted(set(pg) | set(load.backend_pids()))
    step.cpu_pct["postgres"] = round(100 * procstat.cpu_delta(before["postgres"], pg_now) / wall, 1)
    acq_lat = [end - start for start, end in acq_done]
    notice_lat = [end - start for start, end in notice_done]
    step.achieved_acq_per_min = round(achieved_per_min(acq_done, t0, seconds), 1)
    step.acq_p50_s, step.acq_p99_s = pct(acq_lat, 50), pct(acq_lat, 99)
    step.notice_p50_s, step.notice_p99_s = pct(notice_lat, 50), pct(notice_lat, 99)
    if held_after is None or held_before is None:
        step.saturated = f"exclusion workflows not answering queries within {bound_s:.0f} s"
    else:
        # Sent notices the worker has not applied yet do not count.
        applied = min(len(notice_done), held_after - held_before) / max(1, len(notice_done))
        rate = achieved_per_min(notice_done, t0, seconds)
        step.achieved_notices_per_min = round(applied * rate, 1)
    step.instances_under_management = len(
        load.fleet.list_instances(REGION, [InstanceState.ACTIVE, InstanceState.NOTICED])
    )
    if cut:
        step.saturated = cut
    elif failed:
        step.saturated = step.saturated or f"{len(failed)} failed: {failed[0]!r}"[:300]
    elif step.acq_p99_s is not None and step.acq_p99_s > bound_s:
        step.saturated = f"acquisition p99 {step.acq_p99_s:.1f} s > {bound_s:g} s"
    elif step.achieved_acq_per_min < SATURATED_FRACTION * step.offered_acq_per_min:
        step.saturated = "achieved acquisitions < 90 % of offered"
    elif step.achieved_notices_per_min < SATURATED_FRACTION * step.offered_notices_per_min:
        step.saturated = "achieved notices < 90 % of offered"
    return step


async def unit_costs(
    load: Load, procs: dict[str, list[int]], n: int, per_min: float, bound_s: float
) -> dict[str, dict[str, float]]:
    """CPU-ms per unit of each kind of work apart: `n` acquisitions alone, then `n`
    notices alone (on instances under management), each at `per_min` on a schedule, the
    CPU of every process from /proc over each window divided by the units done (a notice
    counts once its exclusion workflow holds it). {kind: {process: ms, "units": n}}."""
    out: dict[str, dict[str, float]] = {}

    async def window(kind: str, jobs: list[Callable[[], Awaitable[tuple[float, float]]]]) -> None:
        before = {name: procstat.snapshot(pids) for name, pids in procs.items()}
        held = await load.applied_notices(bound_s) if kind == "notice" else 0
        done: list[tuple[float, float]] = []

        async def one(i: int) -> None:
            done.append(await jobs[i]())

        await asyncio.wait_for(
            scheduled(len(jobs), per_min / 60, one), len(jobs) * 60 / per_min + 2 * bound_s
        )
        if kind == "notice":
            # Applied by the worker: the exclusion workflows hold them (queries served).
            after = await load.applied_notices(bound_s)
            units = min(len(done), (after or 0) - (held or 0))
        else:
            units = len(done)
        if units <= 0:
            return
        out[kind] = {
            name: round(1000 * procstat.cpu_delta(before[name], pids) / units, 2)
            for name, pids in procs.items()
        }
        out[kind]["units"] = units

    await window("acquisition", [load.acquire for _ in range(n)])
    targets = load.active()[:n]
    load.noticed.update(i for i, _ in targets)
    await window("notice", [functools.partial(load.notice, iid, pool) for iid, pool in targets])
    return out


def plot(steps: list[Step], out: Path, name: str = "saturation.png", workers: int = 1) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [s.offered_acq_per_min for s in steps]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1.plot(x, x, "k:", label="offered = achieved")
    ax1.plot(x, [s.achieved_acq_per_min for s in steps], "o-", label="acquisitions/min")
    ax1.plot(
        [s.offered_notices_per_min for s in steps],
        [s.achieved_notices_per_min for s in steps],
        "s-",
        label="notices/min",
    )
    ax1.set_xlabel("offered per minute")
    ax1.set_ylabel("achieved per minute")
    ax1.set_title(f"{workers} region worker(s): offered vs achieved")
    ax1.legend()
    for process in steps[0].cpu_pct if steps else []:
        ax2.plot(x, [s.cpu_pct.get(process, 0.0) for s in steps], "o-", label=process)
    ax2.set_xlabel("offered acquisitions/min")
    ax2.set_ylabel("CPU % of one core")
    ax2.set_title(f"CPU per process (load {os.getloadavg()[0]:.0f}, {os.cpu_count()} CPUs)")
    ax2.legend()
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def start_processes(specs: list[tuple[Path, str, list[str]]], env: dict[str, str]) -> list[Process]:
    """Start every (log, ready line, args) at once (start-up is slow on a loaded machine),
    then wait for each one's ready line; on a failure all are stopped."""
    procs = [Process(env, log, *args) for log, _, args in specs]
    try:
        for proc, (_, ready, _) in zip(procs, specs, strict=True):
            proc.wait_for(ready, timeout=180)
    except AssertionError:
        for proc in procs:
            stop(proc)
        raise
    return procs


def stop(proc: Process) -> None:
    if proc.proc.poll() is None:
        proc.proc.send_signal(signal.SIGTERM)
        try:
            proc.proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def ramp(args: argparse.Namespace, report: Report, tmp: Path) -> list[Step]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        data_converter=pydantic_data_converter,
        ui=False,
    )
    dsn = services.scratch_database(BASE_DSN)
    started: list[Process] = []
    try:
        address = env.client.service_client.config.target_host
        await bootstrap_namespace(env.client, REGION, timedelta(days=1))
        client = await Client.connect(
            address, namespace=REGION, data_converter=pydantic_data_converter
        )
        await ensure_search_attributes(client, REGION)
        region = load_region(ROOT / "deploy" / "regions" / f"{REGION}.toml")
        migrate(dsn)
        pool = open_pool(dsn, max_size=4)
        fleet = FleetRepository(pool)
        fleet.sync_pools(region)
        penv = {
            **os.environ,
            "SCO_REGIONS_DIR": str(ROOT / "deploy" / "regions"),
            "SCO_DATA_DIR": str(tmp / "data"),
            "SCO_POSTGRES_DSN": dsn,
            "SCO_NATS_URL": args.nats,
            "SCO_PROVIDER__SIMULATOR_PREFIX": f"sat{uuid.uuid4().hex[:8]}",
            "SCO_LEDGER_DSN": f"chdb://{tmp / 'ledger'}",
            "SCO_TEMPORAL__ADDRESS": address,
            "SCO_TEMPORAL__NAMESPACE_PREFIX": "",
            "SCO_WORKER__START_CONTROLLERS": "false",
            "SCO_WORKER__METRICS_PORT": "0",
            "SCO_WORKER__HEALTH_PORT": "0",
            # 0: its default port is one for every worker of --workers (and the box's)
            "SCO_WORKER__STATE_METRICS_PORT": "0",
            "SCO_CONTROL__BUDGET_RATE_PER_SECOND": "1000",
            "SCO_CONTROL__BUDGET_BURST": "1000",
            # The simulated cloud takes it: the budget stays within the provider's limit.
            "SCO_PROVIDER__API_RATE_LIMIT_PER_SECOND": "1000",
            "SCO_PROVIDER__API_BURST_LIMIT": "1000",
            "SCO_CONTRACTS__CACHE_DIR": str(tmp / "none"),
            "SCO_CONTRACTS__TRUST_DIR": str(tmp / "none"),
        }
        sim_args = ["sim", "serve", "--region", REGION, "--boot-seconds", "0"]
        # --workers N: N `sco worker` processes on the region's task queues, as Temporal
        # scales a region (each polls the same queues; the server hands tasks to either).
        sim, *workers = start_processes(
            [
                (tmp / "sim.log", "simulated cloud for r1 on NATS", sim_args),
                *(
                    (tmp / f"worker{n}.log", "worker for r1 on", ["worker", "--region", REGION])
                    for n in range(args.workers)
                ),
            ],
            penv,
        )
        started += [sim, *workers]
        temporal = [p for p, name in procstat.children(os.getpid()) if "temporal" in name]
        procs = {
            "worker": [w.proc.pid for w in workers],
            "simulator": [sim.proc.pid],
            "temporal": temporal,
        }
        report.details["pids"] = {k: v for k, v in procs.items()}
        load = Load(client, fleet, Slots(region), dsn)
        # Warm-up: the budget workflow, the worker's caches; and instances to notice.
        first_notices = max(1, round(args.start / 2 * args.step_seconds / 60))
        await asyncio.wait_for(load.acquire(first_notices), 120 + args.p99_bound)
        # Each kind of work's cost apart (the ramp's steps mix them).
        costs = await unit_costs(
            load, procs, args.unit_count, max(args.start, 60.0), args.p99_bound
        )
        report.details["unit_costs_ms"] = costs
        steps: list[Step] = []
        rate = args.start
        for _ in range(args.steps):
            step = await run_step(load, procs, rate, args.step_seconds, args.p99_bound)
            steps.append(step)
            print(f"step {asdict(step)}", file=sys.stderr, flush=True)
            if step.saturated:
                break
            rate *= args.factor
        pool.close()
        return steps
    finally:
        for proc in reversed(started):
            stop(proc)
        await env.shutdown()
        services.drop_database(dsn)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--start", type=float, default=30.0, help="first step's acquisitions/min")
    ap.add_argument("--factor", type=float, default=2.0, help="each step offers this much more")
    ap.add_argument("--steps", type=int, default=7, help="at most this many steps")
    ap.add_argument("--step-seconds", type=float, default=60.0)
    ap.add_argument("--p99-bound", type=float, default=15.0, help="acquisition p99 bound, s")
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="`sco worker` processes sharing the region's queues (their CPU summed)",
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="PNG dir (bench/results; --tiny: a temp dir)"
    )
    ap.add_argument(
        "--unit-count",
        type=int,
        default=60,
        help="acquisitions, then notices, run alone for their CPU per unit",
    )
    ap.add_argument("--tiny", action="store_true", help="2 steps of 6 s (CI smoke)")
    args = ap.parse_args()
    if args.tiny:
        args.start, args.steps, args.step_seconds, args.unit_count = 30.0, 2, 6.0, 4
    if args.workers < 1:
        ap.error("--workers: at least 1")
    report = Report(
        "saturation" if args.workers == 1 else f"saturation_{args.workers}_workers",
        {
            "workers": args.workers,
            "start_acq_per_min": args.start,
            "factor": args.factor,
            "max_steps": args.steps,
            "step_seconds": args.step_seconds,
            "p99_bound_s": args.p99_bound,
        },
    )
    with tempfile.TemporaryDirectory(prefix="sco-sat-") as tmp:
        steps = asyncio.run(ramp(args, report, Path(tmp)))
        out = args.out or (Path(tmp) if args.tiny else ROOT / "bench" / "results")
        try:
            if steps:
                png = (
                    "saturation.png"
                    if args.workers == 1
                    else f"saturation_{args.workers}_workers.png"
                )
                report.details["plot"] = str(plot(steps, out, png, args.workers))
        except ImportError:
            report.notes.append("no PNG: matplotlib missing (pip install -e '.[plots]')")
    report.details["curve"] = [asdict(s) for s in steps]
    if not steps:
        report.measurement_missing(
            "peak_acquisitions_per_min", "no step ran", "/min", anchor="the ramp"
        )
        return report.emit()
    who = (
        "one `sco worker` process"
        if args.workers == 1
        else f"{args.workers} `sco worker` processes"
    )
    anchor = f"{who}; offered open-loop on a schedule"
    ok = [s for s in steps if not s.saturated]
    # Saturated at the very first step (a loaded machine) is a result: it sustains less
    # than the first offered rate, and the curve says how much it did achieve.
    best = ok[-1] if ok else None
    where = "last unsaturated step" if ok else "none unsaturated: 0"
    report.figure(
        "sustained_acquisitions_per_min",
        best.achieved_acq_per_min if best else 0.0,
        "/min",
        anchor=f"{anchor} (1 instance each, start to result); {where}",
    )
    report.figure(
        "sustained_notices_per_min",
        best.achieved_notices_per_min if best else 0.0,
        "/min",
        anchor=f"NOTICE write + exclusion signal, applied by the worker; {where}",
    )
    report.figure(
        "peak_acquisitions_per_min",
        max(s.achieved_acq_per_min for s in steps),
        "/min",
        anchor=f"{anchor}; the most any step achieved",
    )
    report.figure(
        "instances_under_management",
        max(s.instances_under_management for s in steps),
        "instances",
        anchor="ACTIVE + NOTICED in fleet state at the last step's end",
    )
    top = best or steps[0]
    report.figure(
        "acquisition_p99",
        top.acq_p99_s or 0.0,
        "s",
        anchor=f"{anchor}; at {top.offered_acq_per_min:g}/min offered",
    )
    # The cost of the work apart from the dev server's: CPU per acquisition at the last
    # unsaturated step, where the work offered was done (each step offers half as many
    # notices as acquisitions, so a notice's share is in it).
    if best is not None and best.acquisitions_done:
        for name, cpu in best.cpu_s.items():
            report.figure(
                f"cpu_ms_{name}_per_acquisition",
                1000 * cpu / best.acquisitions_done,
                "ms",
                anchor=f"/proc utime+stime over the step at {best.offered_acq_per_min:g}/min "
                f"offered / its {best.acquisitions_done} acquisitions (with "
                f"{best.notices_done} notices)",
            )
    costs = report.details.get("unit_costs_ms", {})
    for kind in ("acquisition", "notice"):
        got = costs.get(kind)
        for name in ("worker", "temporal"):
            fig = f"cpu_ms_{name}_per_{kind}_alone"
            anchor = (
                f"/proc utime+stime of the {name} over {kind}s run alone at "
                f"{max(args.start, 60.0):g}/min / the units done"
            )
            if got is None:
                report.measurement_missing(
                    fig, f"no {kind} done in its window", "ms", anchor=anchor
                )
            else:
                report.figure(fig, got[name], "ms", anchor=f"{anchor} ({got['units']:g})")
    last = steps[-1]
    for name, value in last.cpu_pct.items():
        report.figure(
            f"cpu_{name}_at_last_step",
            value,
            "% of a core",
            anchor=f"/proc utime+stime over the step at {last.offered_acq_per_min:g}/min offered",
        )
    if last.saturated:
        report.figure(
            "saturated_at_offered_acquisitions_per_min",
            last.offered_acq_per_min,
            "/min",
            anchor=f"the first step that saturated: {last.saturated}",
        )
    else:
        report.notes.append(
            f"not saturated up to {last.offered_acq_per_min:g} acquisitions/min offered"
        )
    return report.emit()


if __name__ == "__main__":
    run_and_exit(main)  # no teardown: Temporal's threads abort it
