"""A failing acquisition deletes its instances (compensation): fleet-state writes that
exhaust their retries fail the acquisition, and every instance it had created is deleted
at the provider, counted with the provider's own listing. Time-skipping server, real
PostgreSQL, the in-process simulated cloud."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from activities.events import EventKind, InstanceState
from activities.fleet.activities import FleetActivities, RecordEventInput, RecordOutput
from activities.fleet.repository import FleetRepository
from contracts.region import Region
from tests.support import histories
from tests.support.control_harness import Harness, instant_boot_worker
from tests.support.paths import REGIONS_DIR
from workflows.acquisition.models import AcquisitionState
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.provider_calls import STATE_RETRY


class ReadyWritesFail(FleetActivities):
    """Fleet state that takes the REQUESTED rows and then goes away for the READY writes
    (what a database lost for longer than the retries looks like to the activity)."""

    calls = 0

    @activity.defn(name="fleet.record_event")
    def record_event(self, inp: RecordEventInput) -> RecordOutput:
        if inp.kind is EventKind.READY:
            ReadyWritesFail.calls += 1
            raise psycopg.OperationalError("connection to server lost (test)")
        return super().record_event(inp)


@pytest.fixture
async def harness(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    fleet_repo: FleetRepository,
    tmp_path: Path,
) -> AsyncIterator[Harness]:
    async with instant_boot_worker(
        workflow_env.client,
        region_r1,
        fleet_repo,
        tmp_path,
        fleet_activities=ReadyWritesFail(fleet_repo, REGIONS_DIR),
    ) as h:
        yield h


@pytest.mark.timeout(300)
async def test_state_writes_out_of_retries_delete_the_created_instances(
    harness: Harness, fleet_repo: FleetRepository
) -> None:
    name = f"comp-{uuid.uuid4().hex[:8]}"
    handle = await harness.start_acquisition(name, instances=4, max_parallel=2)
    ReadyWritesFail.calls = 0
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), timeout=240)
    await histories.record(handle, "acquisition_compensated")
    # The READY writes were retried to the policy's end before the acquisition gave up.
    assert STATE_RETRY.maximum_attempts and ReadyWritesFail.calls >= STATE_RETRY.maximum_attempts
    # Counted at the provider with its own listing: nothing of this acquisition is left,
    # and everything it created was deleted.
    left = [i for i in await harness.cloud.list_owned("r1") if i.name.startswith(handle.id)]
    assert left == []
    assert harness.cloud.calls["create"] == 4 and harness.cloud.calls["delete"] >= 4
    rows = [r for r in fleet_repo.list_instances("r1") if r.workload == name]
    assert len(rows) == 4 and all(r.state is InstanceState.DELETED for r in rows)
    p = await handle.query(AcquisitionWorkflow.progress)
    assert p.state is AcquisitionState.FAILED and p.deleted == 4 and p.active == 0
    record = harness.control.get_acquisition(handle.id)
    assert record is not None and record.state == AcquisitionState.FAILED.value
