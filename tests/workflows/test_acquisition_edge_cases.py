"""AcquisitionWorkflow on the time-skipping server and the in-process simulator: boots that
fail or hang, a fallback lease that never starts, and pause/cancel while slots wait for
budget tokens (no create after the operator's word is accepted)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.events import InstanceState
from activities.fleet.repository import FleetRepository
from activities.provider.interface import InstanceStatus
from contracts.pool_id import PoolId
from contracts.region import Region
from planning.arbiter import FallbackItem, FallbackPlan
from tests.support.control_harness import (
    Harness,
    instant_boot_worker,
    poll_until,
    skip_time,
)
from tests.support.worker_kills import region_namespace
from workflows.acquisition.models import (
    AcquisitionInput,
    AcquisitionResult,
    AcquisitionState,
    LaunchItem,
    OperatorInput,
)
from workflows.acquisition.workflow import AcquisitionWorkflow


@pytest.fixture
async def harness(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    fleet_repo: FleetRepository,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Harness]:
    rate, burst = getattr(request, "param", (50.0, 50))
    async with instant_boot_worker(
        workflow_env.client,
        region_r1,
        fleet_repo,
        tmp_path,
        rate_per_second=rate,
        burst=burst,
    ) as h:
        yield h


def _item(pool: str, n: int) -> LaunchItem:
    pid = PoolId.parse(pool)
    return LaunchItem(pool_id=pool, hall=pid.hall, flavor=pid.flavor, instances=n, units=n)


async def _start(
    h: Harness, items: list[LaunchItem], **kw: object
) -> WorkflowHandle[AcquisitionWorkflow, AcquisitionResult]:
    name = f"edge-{uuid.uuid4().hex[:8]}"
    return await h.client.start_workflow(
        AcquisitionWorkflow.run,
        AcquisitionInput.model_validate(
            {"region": "r1", "contract": name, "tier": 2, "items": items, **kw}
        ),
        id=f"acq-r1-{name}",
        task_queue=h.queue,
    )


async def _left(h: Harness, handle: WorkflowHandle[AcquisitionWorkflow, AcquisitionResult]) -> int:
    return len([i for i in await h.cloud.list_owned("r1") if i.name.startswith(handle.id)])


async def test_error_boots_are_deleted_and_counted_as_shortfall(
    harness: Harness, fleet_repo: FleetRepository
) -> None:
    harness.cloud.fail_boots(2, InstanceStatus.ERROR)
    handle = await _start(harness, [_item("r1.A.gp.l", 5)], max_parallel=1)
    p = (await handle.result()).progress
    assert (p.active, p.failed, p.shortfall_units) == (3, 2, 2)
    assert p.capacity_errors == {"r1.A.gp.l": 2}
    assert await _left(harness, handle) == 3  # the ERROR servers were deleted
    states = sorted(
        r.state for r in fleet_repo.list_instances("r1") if r.acquisition_id == handle.id
    )
    assert states.count(InstanceState.FAILED) == 2


async def test_a_boot_stuck_in_build_is_deleted_past_the_bound(harness: Harness) -> None:
    harness.cloud.fail_boots(1, InstanceStatus.BUILD)
    handle = await _start(harness, [_item("r1.B.gp.l", 2)], max_parallel=1, build_timeout_seconds=2)
    p = (await handle.result()).progress
    assert (p.active, p.failed, p.shortfall_units) == (1, 1, 1)
    assert await _left(harness, handle) == 1


async def test_a_fallback_lease_that_never_starts_is_deleted(harness: Harness) -> None:
    harness.cloud.lease_status = "ERROR"
    plan = FallbackPlan(
        contract="x",
        shortfall_units=2,
        items=[
            FallbackItem(
                pool_id="r1.A.cpu.xl",
                hall="A",
                flavor="cpu.xl",
                instances=2,
                units=2,
                price_per_hour=0.176,
            )
        ],
        cost_per_hour=0.352,
        current_spend_per_hour=0.0,
        authority_per_hour=1.0,
        needs_approval=False,
        reason="test",
    )
    handle = await _start(harness, [], fallback=plan)
    p = (await handle.result()).progress
    assert p.active == 0 and p.shortfall_units == 2
    assert harness.cloud.calls["create_reservation"] == 1
    assert harness.cloud.calls["delete_reservation"] == 1
    assert harness.cloud._leases == {}


# One token every 20 s: with five slots in flight, four wait for a token at any moment.
@pytest.mark.parametrize("harness", [(0.05, 1)], indirect=True)
async def test_pause_while_slots_wait_for_tokens_makes_no_create_after_it(
    harness: Harness, workflow_env: WorkflowEnvironment
) -> None:
    handle = await _start(harness, [_item("r1.C.gp.l", 6)], max_parallel=5)
    await poll_until(lambda: _created(harness, 1))
    await handle.execute_update(AcquisitionWorkflow.pause, OperatorInput(operator="alice"))
    made = harness.cloud.calls["create"]
    await skip_time(workflow_env, 200)  # ten tokens' worth of time
    assert harness.cloud.calls["create"] == made
    assert (await handle.query(AcquisitionWorkflow.progress)).state is AcquisitionState.PAUSED
    await handle.execute_update(AcquisitionWorkflow.resume, OperatorInput(operator="alice"))
    await skip_time(workflow_env, 200)
    p = (await handle.result()).progress
    assert p.active == 6 and p.state is AcquisitionState.COMPLETED


async def test_cancel_while_slots_wait_for_tokens_makes_no_create_and_never_runs_again(
    dev_server_env: WorkflowEnvironment,
    region_r1: Region,
    fleet_repo: FleetRepository,
    tmp_path: Path,
) -> None:
    """On the dev server, in real time: under load the time-skipping test server refused
    the cancel's workflow task for good ("ACTIVITY_UNKNOWN for scheduledEventId=68": an
    activity completed as its cancel went out, which the real server accepts), and the test
    hung to its timeout. A token every 2 s; 6 s after the cancel, no slot has created."""
    client, _ = await region_namespace(dev_server_env, "cancel-tokens")
    async with instant_boot_worker(
        client, region_r1, fleet_repo, tmp_path, rate_per_second=0.5, burst=1
    ) as harness:
        handle = await _start(harness, [_item("r1.D.gp.l", 6)], max_parallel=5)
        await poll_until(lambda: _created(harness, 1))
        ack = await handle.execute_update(
            AcquisitionWorkflow.cancel, OperatorInput(operator="carol", reason="wrong pool")
        )
        made = harness.cloud.calls["create"]
        assert ack.state is AcquisitionState.CANCELLING
        progress = await handle.query(AcquisitionWorkflow.progress)
        assert progress.state in (AcquisitionState.CANCELLING, AcquisitionState.CANCELLED)
        # sleep is the behaviour under test: three tokens' worth of time with no create
        await asyncio.sleep(6)
        assert harness.cloud.calls["create"] == made
        p = (await asyncio.wait_for(handle.result(), 60)).progress
        assert p.state is AcquisitionState.CANCELLED and p.active == 0
        assert await _left(harness, handle) == 0


async def _created(h: Harness, n: int) -> bool:
    return h.cloud.calls["create"] >= n
