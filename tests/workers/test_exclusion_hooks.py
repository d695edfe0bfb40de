"""The exclusion-cycle hook queue: a notice is queued without waiting, and told to the
pool's exclusion workflow once Temporal answers again (a closed port first, then the real
dev server)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.backoff import CappedBackoff
from contracts.notice import ReclaimNotice
from tests.support import services
from tests.support.wait import checked, eventually_async
from workers.exclusion_hooks import ExclusionHookQueue
from workflows.exclusion.models import exclusion_workflow_id


async def test_hooks_queue_while_temporal_is_away_and_are_told_when_it_is_back(
    region_client: Client,
) -> None:
    closed = f"127.0.0.1:{services.free_port()}"
    attempts = 0

    async def connect() -> Client:
        nonlocal attempts
        attempts += 1
        target = closed if attempts <= 2 else region_client.service_client.config.target_host
        return await Client.connect(
            target, namespace=region_client.namespace, data_converter=pydantic_data_converter
        )

    hooks = ExclusionHookQueue(
        connect, "r1", f"tq-{uuid.uuid4().hex[:6]}", backoff=CappedBackoff(0.1, 0.2)
    )
    hooks.start()
    now = datetime.now(UTC)
    notice = ReclaimNotice(
        notice_id="n1",
        region="r1",
        hall="A",
        node="sco-r1-x",
        pool_id="r1.A.gp.m",
        issued_at=now,
        deadline=now + timedelta(seconds=120),
        reason="test",
    )
    try:
        await asyncio.wait_for(hooks.submit(notice), 0.1)  # never waits on Temporal
        assert hooks.pending == 1
        await eventually_async(
            checked(lambda: hooks.counts.told), timeout=60, what="the exclusion workflow told"
        )
    finally:
        await hooks.close()
    assert hooks.counts.told == 1 and hooks.counts.failed_attempts == 2 and hooks.pending == 0
    desc = await region_client.get_workflow_handle(exclusion_workflow_id("r1.A.gp.m")).describe()
    assert desc.workflow_type == "PoolExclusionWorkflow"
