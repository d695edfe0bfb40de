"""SyncPoolsWorkflow: load the region file's pool catalogue into fleet state."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.fleet.activities import FleetActivities, SyncPoolsInput, SyncPoolsOutput
    from workflows import search_attributes


@workflow.defn
class SyncPoolsWorkflow:
    @workflow.run
    async def run(self, inp: SyncPoolsInput) -> SyncPoolsOutput:
        workflow.upsert_search_attributes([search_attributes.REGION.value_set(inp.region)])
        out = await workflow.execute_activity_method(
            FleetActivities.sync_pools,
            inp,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=5),
        )
        workflow.logger.info("region %s: %d pools, %d changed", out.region, out.pools, out.changed)
        return out
