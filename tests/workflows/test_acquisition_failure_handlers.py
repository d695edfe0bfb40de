"""A failing acquisition answers the updates in flight before it ends (issue 28): a pause
accepted while the run fails gets its answer, and the acquisition still fails and deletes
what it created. Time-skipping server, real PostgreSQL, the in-process simulated cloud.

The READY writes fail *non-retryably* once the pause's ledger decision is under way, so the
run fails at once in real time: no retries to run out, no time to skip (an activity held
open, the pause's decision here, keeps the test server from skipping time, which is why a
version that let the writes retry waited minutes for the failure)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from psycopg_pool import ConnectionPool
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateStage,
)
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.decisions import Decision
from activities.events import EventKind
from activities.fleet.activities import FleetActivities, RecordEventInput, RecordOutput
from activities.fleet.control_state import ControlRepository
from activities.fleet.repository import FleetRepository
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from tests.support import histories
from tests.support.control_harness import Harness, poll_until, region_worker
from tests.support.paths import REGIONS_DIR
from workflows.acquisition.models import (
    AcquisitionResult,
    AcquisitionState,
    OperatorInput,
)
from workflows.acquisition.workflow import AcquisitionWorkflow

#: Longest a held activity waits for the test (well inside its 30 s start-to-close).
HOLD_S = 20.0


class Gates:
    """What the fakes below wait on, shared between the worker's threads and the test."""

    def __init__(self) -> None:
        self.pausing = threading.Event()  # the pause's ledger decision is under way
        self.release = threading.Event()  # the test lets that decision finish


class ReadyWritesRefused(FleetActivities):
    """Fleet state that takes the REQUESTED rows and refuses the READY writes for good
    (non-retryable), once a pause is under way: the slots fail and so does the run."""

    def __init__(self, fleet: FleetRepository, gates: Gates) -> None:
        super().__init__(fleet, REGIONS_DIR)
        self.gates = gates

    @activity.defn(name="fleet.record_event")
    def record_event(self, inp: RecordEventInput) -> RecordOutput:
        if inp.kind is EventKind.READY:
            self.gates.pausing.wait(timeout=HOLD_S)
            raise ApplicationError("fleet state refused the write (test)", non_retryable=True)
        return super().record_event(inp)


class HeldPauseDecisions(ControlRepository):
    """Control state whose `paused` ledger decisions wait for the test: a pause update
    still in flight when the run fails."""

    def __init__(self, pool: ConnectionPool, gates: Gates) -> None:
        super().__init__(pool)
        self.gates = gates

    def record_decision(self, decision: Decision) -> bool:
        if decision.outcome == "paused":
            self.gates.pausing.set()
            self.gates.release.wait(timeout=HOLD_S)
        return super().record_decision(decision)


@pytest.fixture
def gates() -> Gates:
    return Gates()


@pytest.fixture
async def harness(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    fleet_repo: FleetRepository,
    gates: Gates,
    tmp_path: Path,
) -> AsyncIterator[Harness]:
    cloud = SimulatedCloud(
        region_r1, latency=Latency(boot_s=0.0), clock=asyncio.get_running_loop().time
    )
    try:
        async with region_worker(
            workflow_env.client,
            cloud,
            fleet_repo,
            HeldPauseDecisions(fleet_repo._pool, gates),
            bundle_dir=tmp_path / "cache",
            trust_dir=tmp_path / "trust",
            fleet_activities=ReadyWritesRefused(fleet_repo, gates),
        ) as h:
            yield h
    finally:
        gates.pausing.set()
        gates.release.set()  # never leave a worker thread waiting


async def _settled_after_compensation(
    handle: WorkflowHandle[AcquisitionWorkflow, AcquisitionResult],
) -> bool:
    """The workflow task after compensation's last write has completed: the workflow has
    closed, or it is running with only the held pause decision pending and no task."""
    desc = await handle.describe()
    if desc.status is not WorkflowExecutionStatus.RUNNING:
        return True
    raw = desc.raw_description
    pending = list(raw.pending_activities)
    return (
        not raw.HasField("pending_workflow_task")
        and len(pending) == 1
        and pending[0].activity_type.name == "control.record_decision"
    )


@pytest.mark.timeout(120)
async def test_a_pause_in_flight_while_the_run_fails_gets_its_answer(
    harness: Harness, gates: Gates
) -> None:
    name = f"fails-{uuid.uuid4().hex[:8]}"
    handle = await harness.start_acquisition(name, instances=2, max_parallel=2)

    async def both_created() -> bool:
        return harness.cloud.calls["create"] >= 2

    await poll_until(both_created, within=30, what="both slots created")
    pause = await handle.start_update(
        AcquisitionWorkflow.pause,
        OperatorInput(operator="alice", reason="look first"),
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
    )

    async def compensated() -> bool:
        row = harness.control.get_acquisition(handle.id)
        return row is not None and row.state == AcquisitionState.FAILED.value

    await poll_until(compensated, within=30, what="the acquisition recorded as FAILED")
    await poll_until(
        lambda: _settled_after_compensation(handle),
        within=30,
        what="the workflow task after compensation",
    )
    # Before the fix the run ended here, the pause's answer still to come: the workflow
    # closed, or (unfinished-handler warnings are errors in the tests) its task failed.
    status = (await handle.describe()).status
    assert status is WorkflowExecutionStatus.RUNNING, (
        f"the acquisition ended ({status}) with the pause update still in flight"
    )
    failed_tasks = [
        e.workflow_task_failed_event_attributes.failure.message
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]
    assert failed_tasks == [], "the run tried to end with the pause update still in flight"
    gates.release.set()
    ack = await asyncio.wait_for(pause.result(), timeout=30)
    assert ack.message == "paused by alice"
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), timeout=30)
    await histories.record(handle, "acquisition_failed_answers_pause")
    left = [i for i in await harness.cloud.list_owned("r1") if i.name.startswith(handle.id)]
    assert left == []
    p = await handle.query(AcquisitionWorkflow.progress)
    assert p.state is AcquisitionState.FAILED and p.deleted == 2
