"""Make-before-break on an early warning: the region controller (time-skipping server, real
PostgreSQL, the simulated cloud) counts instances with a planned reclaim as leaving and
starts their replacement before the hard notice, at its next tick or at once when woken."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.control.models import partition_of
from activities.events import InstanceState
from contracts.notice import NoticeStage, ReclaimNotice
from tests.support.control_harness import Harness, poll_until, skip_time
from tests.workflows.test_region_controller import CONTRACT, covered, fresh_fleet, harness
from workers.controller_wake import wake_controllers
from workflows.controller.models import (
    ControllerConfig,
    ControllerInput,
    controller_workflow_id,
)
from workflows.controller.workflow import RegionControllerWorkflow

__all__ = ["fresh_fleet", "harness"]  # fixtures shared with the controller's own tests

TICK = 3600.0  # long: the replacement must come from the timer or the wake, not a busy loop
PARTITIONS = 4


def units(size: str) -> int:
    return 2 if size == "xl" else 4


def staying(h: Harness) -> int:
    """Units of the contract on ACTIVE instances without a planned reclaim."""
    leaving = {p.instance_id for p in h.fleet.planned_reclaims("r1")}
    return sum(
        units(r.size)
        for r in h.fleet.list_instances("r1", [InstanceState.ACTIVE])
        if r.workload == CONTRACT and r.instance_id not in leaving
    )


def warning_for(instance_id: str, at: datetime) -> ReclaimNotice:
    return ReclaimNotice(
        notice_id=ReclaimNotice.early_id("r1", instance_id, at),
        region="r1",
        hall="A",
        node=instance_id,
        pool_id="r1.A.gp.xl",
        issued_at=datetime.now(UTC),
        deadline=at,
        stage=NoticeStage.EARLY,
    )


@pytest.fixture
async def controller(harness: Harness) -> AsyncIterator[str]:
    wid = controller_workflow_id("r1", partition_of(CONTRACT, PARTITIONS))
    await harness.client.start_workflow(
        RegionControllerWorkflow.run,
        ControllerInput(
            region="r1",
            partition=partition_of(CONTRACT, PARTITIONS),
            config=ControllerConfig(
                tick_seconds=TICK, release_idle_seconds=300, partitions=PARTITIONS
            ),
        ),
        id=wid,
        task_queue=harness.queue,
    )
    yield wid
    await harness.client.get_workflow_handle(wid).terminate()


async def test_planned_reclaims_are_replaced_before_their_hard_notice(
    harness: Harness, workflow_env: WorkflowEnvironment, controller: str
) -> None:
    harness.control.set_demand("r1", "cli", {CONTRACT: 40})
    handle = harness.client.get_workflow_handle(controller)

    async def enough() -> bool:
        return staying(harness) >= 40

    await poll_until(enough)
    started = (await handle.query(RegionControllerWorkflow.status)).acquisitions_started
    mine = [
        r
        for r in harness.fleet.list_instances("r1", [InstanceState.ACTIVE])
        if r.workload == CONTRACT
    ]

    # 1. Planned, nobody wakes the controller: its next tick (a timer) replaces it.
    first = mine[0]
    at = datetime.now(UTC) + timedelta(hours=2)  # hard notice at at - lead: far past a tick
    assert harness.fleet.plan_reclaim(first.instance_id, at, "operator plan") is not None
    assert staying(harness) < 40
    await skip_time(workflow_env, TICK + 1)
    await poll_until(enough)
    status = await handle.query(RegionControllerWorkflow.status)
    assert status.acquisitions_started > started

    # 2. Planned and woken (what the notice relay's hook does): replaced without a tick.
    second = next(r for r in mine if r.instance_id != first.instance_id)
    assert harness.fleet.plan_reclaim(second.instance_id, at, "Blazar lease") is not None
    assert staying(harness) < 40
    ticks = status.ticks
    woken = await wake_controllers(
        harness.client, "r1", PARTITIONS, warning_for(second.instance_id, at)
    )
    assert woken == 1  # the one partition running here; the others are skipped
    await poll_until(enough)
    after = await handle.query(RegionControllerWorkflow.status)
    assert after.ticks > ticks

    # Make-before-break: the doomed instances still run (the relay deletes them at their
    # deadline), and they are never released as surplus meanwhile.
    await skip_time(workflow_env, 2 * TICK)
    for doomed in (first, second):
        row = harness.fleet.get_instance(doomed.instance_id)
        assert row is not None and row.state is InstanceState.ACTIVE
    assert covered(harness, CONTRACT) >= 40 + units(first.size) + units(second.size)
