"""Waking a region's controllers when a reclaim is planned (an early warning went out).

The controllers count instances with a planned reclaim as leaving at their next tick
(activities/control: snapshot); this signal only makes that tick come now rather than
within `tick_seconds`, so the replacement starts as soon as the warning is out. Sent by
the region worker's notice hooks (workers/notice_hooks.py), from the notice stream: never
waited on by the notice path.
"""

from __future__ import annotations

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from contracts.notice import ReclaimNotice
from workflows.controller.models import (
    DEMAND_CHANGED_SIGNAL,
    DemandChanged,
    controller_workflow_id,
)


async def wake_controllers(
    client: Client, region: str, partitions: int, notice: ReclaimNotice
) -> int:
    """Signal every controller partition of the region (the relay does not know which
    partition owns the instance's contract); one not running is skipped. How many heard."""
    woken = 0
    for partition in range(partitions):
        handle = client.get_workflow_handle(controller_workflow_id(region, partition))
        try:
            await handle.signal(
                DEMAND_CHANGED_SIGNAL,
                DemandChanged(source=f"early warning {notice.notice_id} for {notice.node}"),
            )
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            continue
        woken += 1
    return woken
