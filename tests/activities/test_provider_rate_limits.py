"""Throttling through Temporal: with 429s injected, retries wait the Retry-After the
provider named, and a retried create never makes a second instance."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from activities.provider.activities import ProviderActivities
    from activities.provider.interface import CreateRequest, ProviderInstance
    from activities.provider.simulator import Faults, SimulatedCloud
    from contracts.region import Region


@workflow.defn
class LaunchBatch:
    @workflow.run
    async def run(self, requests: list[CreateRequest]) -> list[str]:
        out = []
        for req in requests:
            inst = await workflow.execute_activity(
                "provider.create_instance",
                req,
                result_type=ProviderInstance,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1), maximum_attempts=50
                ),
            )
            out.append(inst.provider_id)
        return out


async def test_retries_honour_retry_after_and_create_nothing_twice(
    dev_server_env: WorkflowEnvironment, region_r1: Region
) -> None:
    workflow_env = dev_server_env  # real retry semantics, in real time: keep delays short
    cloud = SimulatedCloud(
        region_r1, faults=Faults(rate_limit=0.5, retry_after_s=2), clock=lambda: 0.0, seed=3
    )
    real = ProviderActivities(cloud)
    attempts: list[tuple[str, int, datetime]] = []

    @activity.defn(name="provider.create_instance")
    async def create_instance(req: CreateRequest) -> ProviderInstance:
        info = activity.info()
        attempts.append((req.name, info.attempt, info.current_attempt_scheduled_time))
        return await real.create_instance(req)

    pool = region_r1.pool("r1.A.gp.l")
    requests = [
        CreateRequest(
            name=f"sco-r1-rl-{n}", region="r1", pool_id="r1.A.gp.l", hall="A", flavor=pool.flavor
        )
        for n in range(5)
    ]
    queue = f"tq-{uuid.uuid4()}"
    async with Worker(
        workflow_env.client, task_queue=queue, workflows=[LaunchBatch], activities=[create_instance]
    ):
        ids = await workflow_env.client.execute_workflow(
            LaunchBatch.run, requests, id=f"rl-{uuid.uuid4()}", task_queue=queue
        )

    assert len(set(ids)) == 5
    cloud.faults = Faults()
    assert len(await cloud.list_owned("r1")) == 5  # nothing created twice
    retried = [a for a in attempts if a[1] > 1]
    assert retried, "with 50 % throttling some creates must have been retried"
    for name, attempt, scheduled in retried:
        before = next(s for n, a, s in attempts if n == name and a == attempt - 1)
        # The retry policy alone would retry after 1 s; Retry-After said 2 s.
        assert scheduled - before >= timedelta(seconds=1.9), (name, attempt)
