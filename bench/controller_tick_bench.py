"""Workflow-task latency of a region controller tick, planning a whole region (10,000 units).

    .venv/bin/python bench/controller_tick_bench.py [--ticks 30] [--tiny]

The controller (the real RegionControllerWorkflow, in the worker's default sandbox) runs
on Temporal's dev server against the planner bench's headline problem (r1's 144 pools, 14
contracts, 10,000 demand units): its snapshot activity returns that problem every tick,
and the activities that write fleet state and the acquisitions it starts are stand-ins of
the same names (this bench measures the controller's workflow tasks, not them). A
`demand_changed` signal starts each tick.

Every activation of a controller on the worker's workflow thread is timed (wall time and
the thread's CPU time; query-only activations are left out): what one workflow task costs
the thread that runs every workflow of the worker. Twice, in one run:
- `before`: the worker answers `plan-off-thread` with False (patch_activation_callback), so
  the controller plans in its workflow task as running controllers did before the patch;
- `after`: today's path, the greedy plan in the control.greedy_plan local activity.
Target: p99 <= 20 ms after. Prints one JSON report (bench/report.py).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from temporalio import activity, workflow
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import (
    PatchActivationInput,
    Worker,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.control.models import (
    ContractView,
    ControllerSnapshot,
    MarkSurplusInput,
    MarkSurplusOutput,
    SnapshotInput,
)
from activities.fleet.control_state import AcquisitionRecord
from bench.acquisition_stand_in import AcquisitionStandIn
from bench.planner_bench import headline_instance
from bench.report import Report
from planning.planner import Plan, PlanInput, plan
from workers import procstat
from workers.exit_now import run_and_exit
from workers.temporal_bootstrap import ensure_search_attributes
from workflows.controller.models import ControllerConfig, ControllerInput, DemandChanged
from workflows.controller.workflow import PLAN_OFF_THREAD_PATCH, RegionControllerWorkflow

TARGET_MS = 20.0
CONTROLLER = "RegionControllerWorkflow"


class _TimedInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance, record: Callable[[float, float], None]) -> None:
        self._inner = inner
        self._record = record

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        wall, cpu = time.perf_counter(), time.thread_time()
        out = self._inner.activate(act)
        if not all(j.HasField("query_workflow") for j in act.jobs):
            self._record((time.perf_counter() - wall) * 1000, (time.thread_time() - cpu) * 1000)
        return out

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> workflow.Info:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()


class TimedRunner(WorkflowRunner):
    """The worker's default sandboxed runner, timing each controller activation."""

    def __init__(self) -> None:
        self._inner = SandboxedWorkflowRunner()
        self.wall_ms: list[float] = []
        self.cpu_ms: list[float] = []
        self.process_cpu_s = 0.0  # the whole process over the run's ticks
        self.server_cpu_s = 0.0  # the Temporal dev server over the same ticks

    def prepare_workflow(self, defn: Any) -> None:
        self._inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        inst = self._inner.create_instance(det)
        if det.defn.name != CONTROLLER:
            return inst
        return _TimedInstance(inst, self._add)

    def set_worker_level_failure_exception_types(self, types: Any) -> None:
        self._inner.set_worker_level_failure_exception_types(types)

    def _add(self, wall: float, cpu: float) -> None:
        self.wall_ms.append(wall)
        self.cpu_ms.append(cpu)


def snapshot_of(problem: PlanInput) -> ControllerSnapshot:
    return ControllerSnapshot(
        region="r1",
        partition=0,
        bundle_serial=1,
        contracts=[
            ContractView(demand=c, tier=2, authority_per_hour=0.0) for c in problem.contracts
        ],
        pools=problem.pools,
        committed_rate=dict.fromkeys("ABCD", 0.05),
    )


class StandIns:
    """The controller's fleet-state activities, by name: the same problem every tick."""

    def __init__(self, snap: ControllerSnapshot) -> None:
        self._snap = snap

    @activity.defn(name="control.snapshot")
    async def snapshot(self, inp: SnapshotInput) -> ControllerSnapshot:
        return self._snap

    @activity.defn(name="control.greedy_plan")
    def greedy_plan(self, problem: PlanInput) -> Plan:
        return plan(problem)  # what ControlActivities.greedy_plan does

    @activity.defn(name="control.record_acquisition")
    def record_acquisition(self, rec: AcquisitionRecord) -> None:
        return None

    @activity.defn(name="control.mark_surplus")
    def mark_surplus(self, inp: MarkSurplusInput) -> MarkSurplusOutput:
        return MarkSurplusOutput()


def p99(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[98]


async def ticks(client: Client, ticks: int, before: bool, snap: ControllerSnapshot) -> TimedRunner:
    """Run one controller for `ticks` ticks on a worker of its own; its timed runner."""
    runner = TimedRunner()
    stand_ins = StandIns(snap)
    queue = f"tick-bench-{uuid.uuid4().hex[:8]}"

    def activation(inp: PatchActivationInput) -> bool:
        return not (before and inp.patch_id == PLAN_OFF_THREAD_PATCH)

    with concurrent.futures.ThreadPoolExecutor(4) as executor:
        async with Worker(
            client,
            task_queue=queue,
            workflows=[RegionControllerWorkflow, AcquisitionStandIn],
            activities=[
                stand_ins.snapshot,
                stand_ins.greedy_plan,
                stand_ins.record_acquisition,
                stand_ins.mark_surplus,
            ],
            activity_executor=executor,
            workflow_runner=runner,
            patch_activation_callback=activation,
        ):
            handle = await client.start_workflow(
                RegionControllerWorkflow.run,
                ControllerInput(
                    region="r1",
                    partition=0,
                    # Greedy only: the exact plan is a regular activity either way.
                    # One acquisition per contract and tick: the stand-in children's own
                    # workflow tasks run on this worker too, and are not what is measured.
                    config=ControllerConfig(
                        tick_seconds=3600,
                        exact_plan_seconds=0,
                        max_instances_per_acquisition=100_000,
                    ),
                ),
                id=f"controller-tick-bench-{uuid.uuid4().hex[:6]}",
                task_queue=queue,
            )
            done = 0
            cpu0 = time.process_time()
            temporal = [p for p, name in procstat.children(os.getpid()) if "temporal" in name]
            server0 = procstat.snapshot(temporal)
            deadline = time.monotonic() + 30 + 10 * ticks
            while done < ticks and time.monotonic() < deadline:
                st = await handle.query(RegionControllerWorkflow.status)
                if st.ticks > done and not st.pending_signal:
                    done = st.ticks
                    if st.last is not None and st.last.problem:
                        raise RuntimeError(f"tick {done}: {st.last.problem}")
                    await handle.signal(RegionControllerWorkflow.demand_changed, DemandChanged())
                await asyncio.sleep(0.05)
            runner.process_cpu_s = time.process_time() - cpu0
            runner.server_cpu_s = procstat.cpu_delta(server0, temporal)
            await handle.terminate()
            if done < ticks:
                raise RuntimeError(f"{done}/{ticks} ticks in time")
    return runner


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--tiny", action="store_true", help="3 ticks each way (CI smoke)")
    args = ap.parse_args()
    if args.tiny:
        args.ticks = 3
    report = Report("controller_tick", {"ticks": args.ticks})
    problem = headline_instance()
    snap = snapshot_of(problem)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        data_converter=pydantic_data_converter,
        ui=False,
    )
    what = (
        f"every activation of a controller on the workflow thread, {args.ticks} ticks of r1's "
        f"{len(problem.pools)} pools, {len(problem.contracts)} contracts, 10,000 units"
    )
    try:
        await ensure_search_attributes(env.client, env.client.namespace)
        runs = {}
        for name in ("before", "after"):
            runs[name] = await ticks(env.client, args.ticks, name == "before", snap)
    finally:
        await env.shutdown()
    after, before = runs["after"], runs["before"]
    report.figure(
        "controller_tick_wft_p99",
        p99(after.wall_ms),
        "ms",
        anchor=what + "; greedy plan in the control.greedy_plan local activity",
        target=TARGET_MS,
        comparator="<=",
    )
    report.figure(
        "controller_tick_wft_cpu_p99",
        p99(after.cpu_ms),
        "ms",
        anchor=what + "; the workflow thread's CPU time",
    )
    report.figure(
        "controller_tick_wft_p99_before",
        p99(before.wall_ms),
        "ms",
        anchor=what + "; planning in the workflow task (plan-off-thread answered False)",
    )
    report.figure(
        "controller_tick_wft_max",
        max(after.wall_ms),
        "ms",
        anchor=what + "; the slowest activation, greedy plan in the local activity",
    )
    report.figure(
        "controller_tick_wft_max_before",
        max(before.wall_ms),
        "ms",
        anchor=what + "; the slowest activation, planning in the workflow task",
    )
    report.figure(
        "controller_tick_cpu_ms",
        after.process_cpu_s * 1000 / args.ticks,
        "ms",
        anchor=what + "; this process's CPU per tick (worker: workflow and local activity "
        "threads, the tick's 14 stand-in acquisitions and activities, the bench's client), "
        "not the dev server's",
    )
    report.figure(
        "controller_tick_cpu_ms_temporal",
        after.server_cpu_s * 1000 / args.ticks,
        "ms",
        anchor=what + "; the Temporal dev server's CPU per tick (/proc), its stand-in "
        "acquisitions included",
    )
    report.details["activations"] = {
        name: {
            "count": len(r.wall_ms),
            "wall_ms_p50": round(statistics.median(r.wall_ms), 2),
            "wall_ms_max": round(max(r.wall_ms), 2),
            "cpu_ms_p50": round(statistics.median(r.cpu_ms), 2),
            "cpu_ms_max": round(max(r.cpu_ms), 2),
        }
        for name, r in runs.items()
    }
    return report.emit()


if __name__ == "__main__":
    run_and_exit(lambda: asyncio.run(main()))  # no teardown: Temporal's threads abort it
