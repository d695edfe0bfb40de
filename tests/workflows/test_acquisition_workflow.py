"""AcquisitionWorkflow on Temporal's time-skipping server, real PostgreSQL and the
in-process simulated cloud: launches, shortfall, pause/resume, cancel, fallback approval
and its deadline."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from psycopg_pool import ConnectionPool
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities.events import CapacityType, InstanceState
from activities.fleet.control_state import ControlRepository
from activities.fleet.repository import FleetRepository
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.pool_id import PoolId
from contracts.region import Region
from planning.arbiter import FallbackItem, FallbackPlan
from tests.support import histories
from tests.support.control_harness import Harness, poll_until, region_worker, skip_time
from workflows import search_attributes as sa
from workflows.acquisition.models import (
    AcquisitionInput,
    AcquisitionProgress,
    AcquisitionResult,
    AcquisitionState,
    ApprovalInput,
    FallbackState,
    LaunchItem,
    OperatorInput,
)
from workflows.acquisition.workflow import AcquisitionWorkflow


@pytest.fixture
def control_repo(fleet_repo: FleetRepository) -> ControlRepository:
    return ControlRepository(fleet_repo._pool)


@pytest.fixture
async def harness(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    fleet_repo: FleetRepository,
    control_repo: ControlRepository,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Harness]:
    rate = getattr(request, "param", 50.0)
    loop = asyncio.get_running_loop()
    cloud = SimulatedCloud(region_r1, latency=Latency(boot_s=0.0), clock=loop.time)
    async with region_worker(
        workflow_env.client,
        cloud,
        fleet_repo,
        control_repo,
        bundle_dir=tmp_path / "cache",
        trust_dir=tmp_path / "trust",
        rate_per_second=rate,
        burst=max(1, int(rate)),
    ) as h:
        yield h


def contract() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def item(pool: str = "r1.A.gp.l", n: int = 3, units: int | None = None) -> LaunchItem:
    pid = PoolId.parse(pool)
    return LaunchItem(pool_id=pool, hall=pid.hall, flavor=pid.flavor, instances=n, units=units or n)


async def start(
    h: Harness, inp: AcquisitionInput
) -> WorkflowHandle[AcquisitionWorkflow, AcquisitionResult]:
    return await h.client.start_workflow(
        AcquisitionWorkflow.run,
        inp,
        id=f"acq-r1-{inp.contract}-{uuid.uuid4().hex[:6]}",
        task_queue=h.queue,
    )


async def _progress(
    handle: WorkflowHandle[AcquisitionWorkflow, AcquisitionResult],
    check: Callable[[AcquisitionProgress], bool],
) -> bool:
    return check(await handle.query(AcquisitionWorkflow.progress))


def outbox_decisions(pool: ConnectionPool, workflow_id: str) -> list[tuple[str, str]]:
    with pool.connection() as conn:
        rows = conn.execute(
            """SELECT payload->>'outcome', payload->>'actor' FROM outbox
               WHERE topic = 'sco.r1.decisions' AND payload->>'workflow_id' = %s ORDER BY id""",
            (workflow_id,),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


async def test_launches_every_instance_once_and_registers_it(
    harness: Harness, fleet_repo: FleetRepository
) -> None:
    name = contract()
    inp = AcquisitionInput(
        region="r1", contract=name, tier=2, items=[item("r1.A.gp.l", 3), item("r1.B.gp.xl", 2, 4)]
    )
    handle = await start(harness, inp)
    result = await handle.result()
    p = result.progress
    assert p.state is AcquisitionState.COMPLETED
    assert (p.requested_instances, p.launched, p.active, p.shortfall_units) == (5, 5, 5, 0)
    assert len(result.instance_ids) == 5
    rows = [r for r in fleet_repo.list_instances("r1") if r.workload == name]
    assert {r.instance_id for r in rows} == set(result.instance_ids)
    assert all(r.state is InstanceState.ACTIVE and r.provider_id for r in rows)
    # Exactly one provider instance per slot, named by the slot.
    owned = [i for i in await harness.cloud.list_owned("r1") if i.name.startswith(handle.id)]
    assert sorted(i.name for i in owned) == sorted(result.instance_ids)
    desc = await handle.describe()
    attrs = desc.typed_search_attributes
    assert attrs.get(sa.STATE) == "completed" and attrs.get(sa.WORKLOAD) == name
    assert attrs.get(sa.REQUESTED) == 5 and attrs.get(sa.ACQUIRED) == 5
    assert sorted(attrs.get(sa.HALL) or []) == ["A", "B"]
    assert outbox_decisions(fleet_repo._pool, handle.id) == [("completed", "sco")]


async def test_capacity_errors_are_a_shortfall_not_a_failure(harness: Harness) -> None:
    harness.cloud.fail_hall("D")
    try:
        inp = AcquisitionInput(
            region="r1",
            contract=contract(),
            tier=3,
            items=[item("r1.A.cpu.l", 2), item("r1.D.cpu.l", 3, 6)],
        )
        result = await (await start(harness, inp)).result()
    finally:
        harness.cloud.restore_hall("D")
    p = result.progress
    assert p.state is AcquisitionState.COMPLETED
    assert (p.active, p.failed, p.shortfall_units) == (2, 3, 6)
    assert p.capacity_errors == {"r1.D.cpu.l": 3}


@pytest.mark.parametrize("harness", [1.0], indirect=True)
async def test_pause_stops_creates_until_resume(
    harness: Harness, workflow_env: WorkflowEnvironment, fleet_repo: FleetRepository
) -> None:
    inp = AcquisitionInput(
        region="r1", contract=contract(), tier=2, items=[item("r1.A.mem.l", 6)], max_parallel=1
    )
    handle = await start(harness, inp)
    ack = await handle.execute_update(AcquisitionWorkflow.pause, OperatorInput(operator="alice"))
    assert ack.state is AcquisitionState.PAUSED
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update(AcquisitionWorkflow.pause, OperatorInput(operator="bob"))
    before = await handle.query(AcquisitionWorkflow.progress)
    await skip_time(workflow_env, 120)
    after = await handle.query(AcquisitionWorkflow.progress)
    assert after.launched == before.launched and after.state is AcquisitionState.PAUSED
    assert after.paused_by == "alice"
    await handle.execute_update(
        AcquisitionWorkflow.resume, OperatorInput(operator="alice", reason="window over")
    )
    result = await handle.result()
    assert result.progress.active == 6 and result.progress.state is AcquisitionState.COMPLETED
    # Recorded before pause and resume were decisions: replays under the patch (see
    # test_control_replay), so acquisitions paused before the change keep running.
    await histories.record(handle, "acquisition_paused")
    decided = outbox_decisions(fleet_repo._pool, handle.id)
    assert decided[:2] == [("paused", "alice"), ("resumed", "alice")], decided


@pytest.mark.parametrize("harness", [1.0], indirect=True)
async def test_cancel_deletes_what_it_created(
    harness: Harness, fleet_repo: FleetRepository
) -> None:
    name = contract()
    inp = AcquisitionInput(
        region="r1", contract=name, tier=2, items=[item("r1.B.gp.l", 8)], max_parallel=2
    )
    handle = await start(harness, inp)
    await poll_until(lambda: _progress(handle, lambda p: p.active >= 2))
    await handle.execute_update(
        AcquisitionWorkflow.cancel, OperatorInput(operator="carol", reason="wrong pool")
    )
    result = await handle.result()
    p = result.progress
    assert p.state is AcquisitionState.CANCELLED and p.active == 0 and result.instance_ids == []
    await histories.record(handle, "acquisition_cancelled")
    assert p.deleted >= 2
    assert not [i for i in await harness.cloud.list_owned("r1") if i.name.startswith(handle.id)]
    rows = [r for r in fleet_repo.list_instances("r1") if r.workload == name]
    assert rows and all(r.state in (InstanceState.DELETED, InstanceState.FAILED) for r in rows)
    assert outbox_decisions(fleet_repo._pool, handle.id) == [("cancelled", "carol")]


def fallback(needs_approval: bool) -> FallbackPlan:
    return FallbackPlan(
        contract="x",
        shortfall_units=4,
        items=[
            FallbackItem(
                pool_id="r1.A.cpu.xl",
                hall="A",
                flavor="cpu.xl",
                instances=1,
                units=2,
                price_per_hour=0.176,
            ),
            FallbackItem(
                pool_id="r1.B.cpu.xl",
                hall="B",
                flavor="cpu.xl",
                instances=1,
                units=2,
                price_per_hour=0.176,
            ),
        ],
        cost_per_hour=0.352,
        current_spend_per_hour=0.0,
        authority_per_hour=0.1 if needs_approval else 1.0,
        needs_approval=needs_approval,
        reason="test",
    )


async def test_fallback_within_authority_proceeds_on_committed_capacity(
    harness: Harness, fleet_repo: FleetRepository
) -> None:
    name = contract()
    inp = AcquisitionInput(region="r1", contract=name, tier=1, fallback=fallback(False))
    handle = await start(harness, inp)
    result = await handle.result()
    assert result.progress.fallback is FallbackState.PROCEEDING
    assert result.progress.active == 2
    rows = [r for r in fleet_repo.list_instances("r1") if r.workload == name]
    assert {r.capacity_type for r in rows} == {CapacityType.COMMITTED}
    assert {r.price_per_hour for r in rows} == {0.176}
    assert len(await harness.cloud.list_reservations("r1")) >= 2
    assert outbox_decisions(fleet_repo._pool, handle.id) == [
        ("proceed", "sco"),
        ("completed", "sco"),
    ]


async def test_fallback_above_authority_waits_for_an_operator(
    harness: Harness, fleet_repo: FleetRepository
) -> None:
    inp = AcquisitionInput(
        region="r1",
        contract=contract(),
        tier=1,
        items=[item("r1.C.gp.l", 1)],
        fallback=fallback(True),
    )
    handle = await start(harness, inp)
    await poll_until(
        lambda: _progress(handle, lambda p: p.fallback is FallbackState.AWAITING_APPROVAL)
    )
    desc = await handle.describe()
    assert desc.typed_search_attributes.get(sa.STATE) == "waiting_approval"
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(AcquisitionWorkflow.resume, OperatorInput())
    assert "not paused" in str(refused.value.cause)
    ack = await handle.execute_update(
        AcquisitionWorkflow.approve_fallback, ApprovalInput(approver="dana", reason="release night")
    )
    assert "approved by dana" in ack.message
    result = await handle.result()
    p = result.progress
    assert p.fallback is FallbackState.APPROVED and p.decided_by == "dana" and p.active == 3
    await histories.record(handle, "acquisition_approved")
    assert outbox_decisions(fleet_repo._pool, handle.id) == [
        ("awaiting_approval", "sco"),
        ("approved", "dana"),
        ("completed", "sco"),
    ]
    # Approving once it is decided is refused (by the validator, or the closed workflow).
    with pytest.raises((WorkflowUpdateFailedError, RPCError)):
        await handle.execute_update(
            AcquisitionWorkflow.approve_fallback, ApprovalInput(approver="dana", reason="again")
        )


async def test_fallback_declines_at_the_deadline(
    harness: Harness, fleet_repo: FleetRepository, workflow_env: WorkflowEnvironment
) -> None:
    inp = AcquisitionInput(
        region="r1",
        contract=contract(),
        tier=1,
        fallback=fallback(True),
        approval_timeout_seconds=600,
    )
    handle = await start(harness, inp)
    result = await handle.result()  # the test server skips the 10 minutes
    p = result.progress
    assert p.state is AcquisitionState.DECLINED and p.fallback is FallbackState.DECLINED
    assert p.decided_by == "deadline" and p.shortfall_units == 4 and p.launched == 0
    assert outbox_decisions(fleet_repo._pool, handle.id) == [
        ("awaiting_approval", "sco"),
        ("declined", "deadline"),
        ("declined", "sco"),
    ]


@pytest.mark.parametrize("harness", [1.0], indirect=True)
async def test_a_second_cancel_of_a_cancelling_acquisition_answers_ok(harness: Harness) -> None:
    inp = AcquisitionInput(
        region="r1", contract=contract(), tier=2, items=[item("r1.B.gp.l", 6)], max_parallel=1
    )
    handle = await start(harness, inp)
    await poll_until(lambda: _progress(handle, lambda p: p.active >= 1))
    first = await handle.execute_update(
        AcquisitionWorkflow.cancel, OperatorInput(operator="carol", reason="wrong pool")
    )
    again = await handle.execute_update(
        AcquisitionWorkflow.cancel, OperatorInput(operator="dave", reason="retry")
    )
    assert first.state is again.state is AcquisitionState.CANCELLING
    assert again.message == "already cancelling (by carol)"
    result = await handle.result()
    assert result.progress.state is AcquisitionState.CANCELLED
