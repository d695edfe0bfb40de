"""What the floor keeper and the lifecycle workflow both do to boot capacity: record the
acquisition row (so `sco acquisitions list` shows it from the start), then run it as a
child AcquisitionWorkflow that outlives its parent (ABANDON: a parent's continue-as-new or
restart must not cancel a launch half done). Deterministic workflow code; `gather` runs
awaitables concurrently through `workflow.wait`.

Both workflows made these commands in this order before the code was shared, so their
recorded histories replay unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.control.activities import ControlActivities
    from activities.fleet.control_state import AcquisitionRecord
    from workflows.acquisition.models import AcquisitionInput, AcquisitionResult
    from workflows.acquisition.workflow import AcquisitionWorkflow

T = TypeVar("T")


async def gather(aws: list[Awaitable[T]]) -> list[T]:
    """Run awaitables concurrently (workflow.wait, deterministic) and return their results."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    if tasks:
        await workflow.wait(tasks)
    return [t.result() for t in tasks]


async def run_child_acquisition(
    record: AcquisitionRecord, inp: AcquisitionInput, *, record_retry: RetryPolicy, what: str
) -> AcquisitionResult | None:
    """The acquisition `record.acquisition_id`, recorded then run as a child; None (logged
    as `what`) when it failed: the caller counts nothing booted and tries again later."""
    await workflow.execute_activity_method(
        ControlActivities.record_acquisition,
        record,
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=record_retry,
    )
    try:
        result: AcquisitionResult = await workflow.execute_child_workflow(
            AcquisitionWorkflow.run,
            inp,
            id=record.acquisition_id,
            parent_close_policy=ParentClosePolicy.ABANDON,
        )
    except ChildWorkflowError as exc:
        workflow.logger.warning(
            "%s acquisition %s failed: %s", what, record.acquisition_id, exc.cause
        )
        return None
    return result
