"""Floor keeper benchmark: hall loss -> floor whole again, on Temporal's time-skipping
server, real PostgreSQL, the signed example bundle and the in-process simulated cloud.

    .venv/bin/python bench/floor_bench.py [--runs 20] [--detect-runs 4] [--units 100]
        [--boot 30] [--tiny]

Each run: a fresh database and cloud; `llm-train` with its r1 floor raised to `--units`
(gpu-a.l holds one unit: 100 units are 100 instances over halls A-D, 25 each); the keeper
establishes the floor, then one hall (A, B, C, D in turn) fails (`cloud.fail_hall`) and
an operator signals `hall_lost`. Measured: workflow time from the signal to the first
status in which the three survivors hold the whole floor (polled every second of workflow
time, so to within 1 s). The keeper's own `last_rebuild_seconds` ends later, after the
lost hall's instances are released; it is kept in the details, not reported as the
figure. Also, in `--detect-runs` runs without a signal: from the failure to whole, probe
detection (2 probes 15 s apart) included.

What is real: the workflows (keeper, acquisitions, token budget), every activity, the
fleet-state writes in PostgreSQL, the provider calls (create, reservation, delete) against
the simulator. What is modelled: boot time. The simulated cloud's clock is Temporal's
clock (the scheduled time of the activity attempt calling it), and every instance becomes
ACTIVE `--boot` seconds (30) after its create call, all instances of a rebuild booting in
parallel. Waiting for ACTIVE is `provider.wait_active` replaced by a same-named activity
that checks once and fails BENIGN while the instance builds, so Temporal's retry timers
(1, 2, 4, 8, 16 s: the time-skipping server skips them) do the polling; an instance that
is ACTIVE after 30 s is seen at 31 s. Reservations become ACTIVE at once (real Blazar
starts leases on its own ~10 s poll: add that). API latency is not modelled (0 s).
Prints one JSON report (bench/report.py); target p99 <= 120 s (the design allows a hall
loss 15 minutes at most), and no hall above 40 % of the floor afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.budget import BudgetActivities, budget_workflow_id
from activities.control.activities import ControlActivities
from activities.fleet.activities import FleetActivities
from activities.fleet.control_state import ControlRepository
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from activities.floor.activities import FloorActivities
from activities.floor.models import floor_workflow_id
from activities.provider.activities import (
    ProviderActivities,
    WaitActiveInput,
    all_activities,
)
from activities.provider.errors import InsufficientCapacity, ProviderError
from activities.provider.interface import InstanceStatus, ProviderInstance
from activities.provider.simulator import Latency, SimulatedCloud
from bench.report import Report
from contracts.region import load_region
from tests.support import services
from tests.support.paths import BASE_DSN, REGIONS_DIR
from tests.support.signed_bundle import sign_and_install
from workers.exit_now import run_and_exit
from workers.temporal_bootstrap import ensure_search_attributes
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.budget.workflow import TokenBudgetWorkflow
from workflows.floor.models import FloorInput, FloorState, FloorStatus, HallEvent
from workflows.floor.workflow import FloorKeeperWorkflow

TARGET_P99_S = 120.0
MAX_HALL_SHARE_PCT = 40.0
CONTRACT = "llm-train"


class TemporalClock:
    """Temporal's time as the simulated cloud sees it: the scheduled time of the activity
    attempt making the call (the time-skipping server's clock, skips included)."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self) -> float:
        try:
            info = activity.info()
            # The attempt's start: a retry's scheduled time can be its first attempt's.
            t = max(info.current_attempt_scheduled_time, info.started_time).timestamp()
        except RuntimeError:  # outside an activity: the last time seen
            return self.last
        self.last = max(self.last, t)
        return self.last


class PollByRetry(ProviderActivities):
    @activity.defn(name="provider.wait_active")
    async def wait_active(self, inp: WaitActiveInput) -> ProviderInstance:
        try:
            inst = await self._provider.get(inp.provider_id)
        except ProviderError as exc:
            raise exc.to_application_error() from exc
        if inst.status is InstanceStatus.ACTIVE:
            return inst
        if inst.status is InstanceStatus.ERROR:
            raise InsufficientCapacity(f"{inst.name} went to ERROR").to_application_error()
        raise ApplicationError(
            f"{inst.name} is {inst.status.value}",
            type="Booting",
            category=ApplicationErrorCategory.BENIGN,
        )


def make_bundle(base: Path, units: int) -> tuple[Path, Path]:
    src = base / "contracts"
    shutil.copytree(ROOT / "contracts" / "examples", src)
    yaml = src / "llm-train.yaml"
    text = yaml.read_text().replace("floor: {r1: 10, r2: 5}", f"floor: {{r1: {units}, r2: 5}}")
    yaml.write_text(text.replace("max_units_per_region: 30", f"max_units_per_region: {units}"))
    sign_and_install(src, base)
    return base / "cache", base / "trust"


class NotReached(RuntimeError):
    """The keeper did not reach the awaited state within the bound."""


async def status(client: Client) -> FloorStatus:
    st: FloorStatus = await client.get_workflow_handle(floor_workflow_id("r1", CONTRACT)).query(
        FloorKeeperWorkflow.status
    )
    return st


async def until(
    env: WorkflowEnvironment,
    ok: Callable[[FloorStatus], bool],
    step: float = 1.0,
    limit: float = 1800,
    real_limit: float = 600,
) -> FloorStatus:
    """Poll the keeper every `step` s of workflow time until `ok`; bounded in workflow time
    and in real time (a worker that stopped would otherwise be polled for ever)."""
    waited = 0.0
    deadline = time.monotonic() + real_limit
    while True:
        st = await status(env.client)
        if ok(st) and not st.pending:
            return st
        if waited > limit or time.monotonic() > deadline:
            raise NotReached(f"not reached within {limit} s of workflow time: {st}")
        await env.sleep(step)
        waited += step


async def one_run(
    env: WorkflowEnvironment,
    cache: Path,
    trust: Path,
    units: int,
    boot: float,
    hall: str,
    detect: bool,
) -> dict[str, float]:
    region = load_region(REGIONS_DIR / "r1.toml")
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    pool = open_pool(dsn, max_size=8)
    fleet, control = FleetRepository(pool), ControlRepository(pool)
    fleet.sync_pools(region)
    clock = TemporalClock()
    cloud = SimulatedCloud(region, latency=Latency(boot_s=boot), clock=clock)
    queue = f"tq-{uuid.uuid4()}"
    client = env.client
    acts: list[Callable[..., Any]] = [
        *all_activities(PollByRetry(cloud)),
        FleetActivities(fleet, REGIONS_DIR).record_acquire,
        FleetActivities(fleet, REGIONS_DIR).record_event,
    ]
    ctl = ControlActivities(
        fleet, control, cloud, regions_dir=REGIONS_DIR, bundle_cache_dir=cache, trust_dir=trust
    )
    flo = FloorActivities(
        fleet, cloud, regions_dir=REGIONS_DIR, bundle_cache_dir=cache, trust_dir=trust
    )
    budget = BudgetActivities(client, queue, rate_per_second=50.0, burst=200)
    acts += [
        ctl.record_acquisition,
        ctl.record_decision,
        flo.snapshot,
        flo.probe_halls,
        budget.ensure,
    ]
    handle = None
    try:
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            async with Worker(
                client,
                task_queue=queue,
                workflows=[FloorKeeperWorkflow, AcquisitionWorkflow, TokenBudgetWorkflow],
                activities=acts,
                activity_executor=ex,
                max_concurrent_activities=16,
            ):
                handle = await client.start_workflow(
                    FloorKeeperWorkflow.run,
                    FloorInput(region="r1", contract=CONTRACT),
                    id=floor_workflow_id("r1", CONTRACT),
                    task_queue=queue,
                )
                est = await until(
                    env,
                    lambda s: (
                        s.state is FloorState.HOLDING
                        and sum(s.held_units_by_hall.values()) >= units
                    ),
                )
                t0 = await env.get_current_time()
                cloud.fail_hall(hall)
                if not detect:
                    await handle.signal(
                        FloorKeeperWorkflow.hall_lost, HallEvent(hall=hall, operator="bench")
                    )
                # Whole again: the survivors alone hold the floor (seen within 1 s).
                await until(
                    env,
                    lambda s: sum(n for h, n in s.held_units_by_hall.items() if h != hall) >= units,
                )
                whole = (await env.get_current_time() - t0).total_seconds()
                st = await until(
                    env,
                    lambda s: (
                        s.lost_halls == [hall]
                        and s.state is FloorState.HOLDING
                        and s.last_rebuild_seconds is not None
                        and sum(s.held_units_by_hall.values()) >= units
                    ),
                )
                assert st.last_rebuild_seconds is not None
                return {
                    "established_held": float(sum(est.held_units_by_hall.values())),
                    "to_whole_s": whole,
                    "keeper_last_rebuild_s": st.last_rebuild_seconds,
                    "max_hall_share": max(st.held_units_by_hall.values()) / units,
                }
    finally:
        if handle is not None:
            await handle.terminate()
        await client.get_workflow_handle(budget_workflow_id("r1")).terminate()
        pool.close()
        services.drop_database(dsn)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, round(p / 100 * len(xs) + 0.5) - 1))
    return xs[k]


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--detect-runs", type=int, default=4)
    ap.add_argument("--units", type=int, default=100)
    ap.add_argument("--boot", type=float, default=30.0)
    ap.add_argument("--tiny", action="store_true", help="1 + 1 runs of an 8-unit floor")
    args = ap.parse_args()
    if args.tiny:
        args.runs, args.detect_runs, args.units = 1, 1, 8
    report = Report(
        "floor",
        {
            "runs": args.runs,
            "detect_runs": args.detect_runs,
            "floor_units": args.units,
            "boot_s": args.boot,
        },
    )
    signal_anchor = "the operator's hall_lost signal (workflow time; modelled boot)"
    detect_anchor = "the hall's failure, probe detection included (workflow time)"
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=services.test_server_binary(),
        data_converter=pydantic_data_converter,
    )
    await ensure_search_attributes(env.client, env.client.namespace)
    signalled: list[dict[str, float]] = []
    detected: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cache, trust = make_bundle(Path(tmp), args.units)
            for i in range(args.runs + args.detect_runs):
                detect = i >= args.runs
                hall = "ABCD"[i % 4]
                try:
                    r = await one_run(env, cache, trust, args.units, args.boot, hall, detect)
                except NotReached as exc:
                    name = "hall_failure_to_whole_p99" if detect else "hall_lost_to_whole_p99"
                    report.measurement_missing(
                        name,
                        f"run {i} (hall {hall}): {exc}"[:300],
                        "s",
                        anchor=detect_anchor if detect else signal_anchor,
                        target=TARGET_P99_S,
                        comparator="<=",
                    )
                    return report.emit()
                (detected if detect else signalled).append(r)
    finally:
        await env.shutdown()
    rebuild = [r["to_whole_s"] for r in signalled]
    if rebuild:
        report.figure(
            "hall_lost_to_whole_p50", statistics.median(rebuild), "s", anchor=signal_anchor
        )
        report.figure(
            "hall_lost_to_whole_p99",
            pct(rebuild, 99),
            "s",
            anchor=f"{signal_anchor}; {len(rebuild)} runs",
            target=TARGET_P99_S,
            comparator="<=",
        )
    det = [r["to_whole_s"] for r in detected]
    if det:
        report.figure(
            "hall_failure_to_whole_p99",
            pct(det, 99),
            "s",
            anchor=f"{detect_anchor}; {len(det)} runs",
            target=TARGET_P99_S,
            comparator="<=",
        )
    runs = signalled + detected
    if runs:
        report.figure(
            "max_hall_share_after",
            100 * max(r["max_hall_share"] for r in runs),
            "%",
            anchor="the floor's units, in the worst hall once whole again",
            target=MAX_HALL_SHARE_PCT,
            comparator="<=",
        )
    report.details.update(
        {
            "hall_lost_to_whole_s": sorted(rebuild),
            "hall_failure_to_whole_s": sorted(det),
            # Ends after the lost hall's instances are released: later than "whole".
            "keeper_last_rebuild_s": sorted(r["keeper_last_rebuild_s"] for r in runs),
        }
    )
    return report.emit()


if __name__ == "__main__":
    run_and_exit(lambda: asyncio.run(main()))  # no teardown: Temporal's threads abort it
