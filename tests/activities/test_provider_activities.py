"""Provider activities in Temporal's ActivityEnvironment: typed errors, heartbeats."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.provider.activities import ProviderActivities, WaitActiveInput
from activities.provider.errors import RateLimited
from activities.provider.interface import CreateRequest
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region


def req(name: str = "sco-r1-test-1") -> CreateRequest:
    return CreateRequest(name=name, region="r1", pool_id="r1.A.gp.l", hall="A", flavor="gp.l")


async def test_wait_active_heartbeats_until_active(region_r1: Region) -> None:
    loop = asyncio.get_running_loop()
    cloud = SimulatedCloud(region_r1, latency=Latency(boot_s=0.3), clock=loop.time)
    acts = ProviderActivities(cloud)
    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    inst = await env.run(acts.create_instance, req())
    done = await env.run(
        acts.wait_active, WaitActiveInput(provider_id=inst.provider_id, poll_seconds=0.05)
    )
    assert done.status.value == "ACTIVE" and len(beats) >= 3


async def test_errors_leave_as_typed_application_errors(region_r1: Region) -> None:
    cloud = SimulatedCloud(region_r1, clock=lambda: 0.0)
    acts = ProviderActivities(cloud)
    env = ActivityEnvironment()
    cloud.fail_next(RateLimited("429", retry_after=3))
    with pytest.raises(ApplicationError) as err:
        await env.run(acts.create_instance, req())
    assert err.value.type == "RateLimited" and not err.value.non_retryable
    assert (
        err.value.next_retry_delay is not None and err.value.next_retry_delay.total_seconds() == 3
    )
    cloud.fail_hall("A")
    with pytest.raises(ApplicationError) as err:
        await env.run(acts.create_instance, req("sco-r1-test-2"))
    assert err.value.type == "InsufficientCapacity" and err.value.non_retryable
