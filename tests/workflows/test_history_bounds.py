"""Temporal history stays bounded at any size: an acquisition of the largest size the
controller starts, and a controller through many ticks across continue-as-new, stay far
under Temporal's per-workflow limits (51,200 events and 50 MB, with warnings from 10,240
events and 10 MB: these tests hold the warning levels)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.api.history.v1 import History
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities.control.models import partition_of
from activities.fleet.control_state import ControlRepository
from activities.fleet.repository import FleetRepository
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from tests.support.control_harness import (
    Harness,
    fleet_repositories,
    install_example_bundle,
    poll_until,
    region_worker,
    skip_time,
)
from workflows.acquisition.models import AcquisitionInput, AcquisitionState, LaunchItem
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.controller.models import ControllerConfig, ControllerInput
from workflows.controller.workflow import RegionControllerWorkflow

pytestmark = pytest.mark.timeout(600)

#: Temporal's warning levels (the hard limits are 5x these).
WARN_EVENTS = 10_240
WARN_BYTES = 10 * 1024 * 1024


@pytest.fixture
def fresh_fleet(region_r1: Region) -> Iterator[tuple[FleetRepository, ControlRepository]]:
    with fleet_repositories(region_r1) as repos:
        yield repos


@pytest.fixture
async def harness(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    fresh_fleet: tuple[FleetRepository, ControlRepository],
    tmp_path: Path,
) -> AsyncIterator[Harness]:
    cache, trust = install_example_bundle(tmp_path)
    loop = asyncio.get_running_loop()
    cloud = SimulatedCloud(region_r1, latency=Latency(boot_s=0.0), clock=loop.time)
    async with region_worker(
        workflow_env.client,
        cloud,
        *fresh_fleet,
        bundle_dir=cache,
        trust_dir=trust,
        rate_per_second=500.0,
        burst=500,
    ) as h:
        yield h


async def history_size(client: Client, workflow_id: str, run_id: str | None) -> tuple[int, int]:
    """(events, bytes of the serialised history) of one run."""
    hist = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    return len(hist.events), History(events=hist.events).ByteSize()


async def test_largest_acquisition_history_is_far_under_the_limits(harness: Harness) -> None:
    size = ControllerConfig().max_instances_per_acquisition
    # Spread over pools as the planner would: 4 halls x 2 SKUs, 25 instances each.
    items = [
        LaunchItem(
            pool_id=f"r1.{hall}.{sku}.l", hall=hall, flavor=f"{sku}.l", instances=25, units=50
        )
        for hall in "ABCD"
        for sku in ("gp", "cpu")
    ]
    assert sum(i.instances for i in items) == size
    wid = f"acq-r1-hist-{uuid.uuid4().hex[:6]}"
    handle = await harness.client.start_workflow(
        AcquisitionWorkflow.run,
        AcquisitionInput(region="r1", contract="history-bound", tier=2, items=items),
        id=wid,
        task_queue=harness.queue,
    )
    result = await handle.result()
    assert result.progress.state is AcquisitionState.COMPLETED
    assert result.progress.active == size
    events, nbytes = await history_size(harness.client, wid, None)
    print(f"acquisition of {size}: {events} events, {nbytes} bytes")
    assert events < WARN_EVENTS / 2, f"{events} events for {size} instances"
    assert nbytes < WARN_BYTES / 10, f"{nbytes} bytes for {size} instances"


async def test_controller_history_is_bounded_by_continue_as_new(
    harness: Harness, workflow_env: WorkflowEnvironment
) -> None:
    harness.control.set_demand("r1", "cli", {"spark-etl": 40, "ci-runners": 60})
    per_run = 10
    wid = f"controller-hist-{uuid.uuid4().hex[:6]}"
    await harness.client.start_workflow(
        RegionControllerWorkflow.run,
        ControllerInput(
            region="r1",
            partition=partition_of("spark-etl", 4),
            config=ControllerConfig(ticks_per_run=per_run, tick_seconds=30),
        ),
        id=wid,
        task_queue=harness.queue,
    )
    handle = harness.client.get_workflow_handle(wid)
    runs = [(await handle.describe()).run_id]

    async def three_runs() -> bool:
        await skip_time(workflow_env, 60)
        run = (await handle.describe()).run_id
        if run != runs[-1]:
            runs.append(run)
        return len(runs) >= 3

    await poll_until(three_runs, within=240)
    status = await handle.query(RegionControllerWorkflow.status)
    # The counters survive continue-as-new: two whole runs behind this one.
    assert status.ticks >= 2 * per_run
    # The first tick had something to plan: the exact planner ran as an activity.
    first = await harness.client.get_workflow_handle(wid, run_id=runs[0]).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in first.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert "control.exact_plan" in scheduled
    assert any(e.HasField("activity_task_completed_event_attributes") for e in first.events)
    sizes = [await history_size(harness.client, wid, run) for run in runs[:2]]
    print(f"controller runs of {per_run} ticks: {sizes}")
    for events, nbytes in sizes:
        # A run of the default 200 ticks, at this run's size per tick, stays under the
        # warning levels (a fifth of the limits). Bytes are the tighter bound: each tick's
        # snapshot carries the region's 144 pools (~40 kB), ~8 MB per 200 ticks; the server's
        # continue-as-new suggestion (the loop checks it every tick) ends a run earlier.
        scale = ControllerConfig().ticks_per_run / per_run
        assert events * scale < WARN_EVENTS / 2, f"{events} events per {per_run} ticks"
        assert nbytes * scale < WARN_BYTES, f"{nbytes} bytes per {per_run} ticks"
    # Each run is about as long as the one before: history does not grow with the ticks.
    assert sizes[1][0] <= 2 * sizes[0][0]
    await handle.terminate()
