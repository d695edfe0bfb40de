"""One contract suite for every CloudProvider implementation.

Runs against the in-process simulator and the simulator service over real NATS (what
workers, relays and agents share); the OpenStack implementation runs the same checks in
`tests/test_testcloud_*.py` when the real test cloud is up.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import nats
import pytest

from activities.provider.errors import InsufficientCapacity, NotFound, RateLimited, Transient
from activities.provider.interface import (
    CloudProvider,
    CreateRequest,
    InstanceStatus,
    ReservationRequest,
)
from activities.provider.sim_service import SimulatorClient, serve
from activities.provider.simulator import Faults, ReclaimModel, SimulatedCloud
from contracts.region import Region

NATS_URL = "nats://127.0.0.1:4222"


@dataclass
class Cloud:
    provider: CloudProvider
    sim: SimulatedCloud  # the simulated cloud behind it, for fault control


@pytest.fixture(params=["in-process", "service"])
async def cloud(request: pytest.FixtureRequest, region_r1: Region) -> AsyncIterator[Cloud]:
    sim = SimulatedCloud(region_r1, clock=lambda: 0.0)
    if request.param == "in-process":
        yield Cloud(sim, sim)
        return
    prefix = f"test{uuid.uuid4().hex[:8]}"  # no other test run answers our requests
    nc = await nats.connect(NATS_URL)
    server = asyncio.create_task(serve(sim, nc, prefix=prefix))
    await asyncio.sleep(0.05)
    client = SimulatorClient(NATS_URL, "r1", prefix=prefix)
    try:
        yield Cloud(client, sim)
    finally:
        server.cancel()
        await client.close()
        await nc.close()


def request(region: Region, pool_id: str, name: str | None = None) -> CreateRequest:
    pool = region.pool(pool_id)
    return CreateRequest(
        name=name or f"sco-{uuid.uuid4().hex[:10]}",
        region=region.id,
        pool_id=pool_id,
        hall=pool.hall,
        flavor=pool.flavor,
    )


async def test_implementations_are_cloud_providers(cloud: Cloud) -> None:
    assert isinstance(cloud.provider, CloudProvider)


async def test_create_get_list_delete(cloud: Cloud, region_r1: Region) -> None:
    p = cloud.provider
    created = await p.create(request(region_r1, "r1.B.gp.l"))
    assert created.hall == "B" and created.pool_id == "r1.B.gp.l"  # the AZ picks the hall
    assert (await p.get(created.provider_id)).status is InstanceStatus.ACTIVE
    assert created.provider_id in {i.provider_id for i in await p.list_owned("r1")}
    assert await p.list_owned("r2") == []
    await p.delete(created.provider_id)
    await p.delete(created.provider_id)  # already gone: still success
    with pytest.raises(NotFound):
        await p.get(created.provider_id)


async def test_a_retried_create_makes_no_duplicate(cloud: Cloud, region_r1: Region) -> None:
    req = request(region_r1, "r1.A.cpu.xl")
    first = await cloud.provider.create(req)
    again = await cloud.provider.create(req)  # the response to the first was "lost"
    assert again.provider_id == first.provider_id
    assert len(await cloud.provider.list_owned("r1")) == 1


async def test_an_exhausted_pool_raises_insufficient_capacity(
    cloud: Cloud, region_r1: Region
) -> None:
    pool_id = "r1.D.bm-gpu.4xl"
    for _ in range(region_r1.pool(pool_id).reclaimable_units):
        await cloud.provider.create(request(region_r1, pool_id))
    assert await cloud.provider.free_capacity(pool_id) == 0
    with pytest.raises(InsufficientCapacity):
        await cloud.provider.create(request(region_r1, pool_id))


async def test_a_reservation_admits_its_amount_and_no_more(cloud: Cloud, region_r1: Region) -> None:
    p = cloud.provider
    lease = await p.create_reservation(
        ReservationRequest(
            name="sco-r1-floor-search-api-A",
            region="r1",
            hall="A",
            flavor="cpu.xl",
            amount=2,
            end=datetime.now(UTC) + timedelta(days=1),
        )
    )
    assert lease.status == "ACTIVE"
    req = request(region_r1, "r1.A.cpu.xl")
    for n in range(2):
        await p.create(
            req.model_copy(update={"name": f"floor-{n}", "reservation_id": lease.reservation_id})
        )
    with pytest.raises(InsufficientCapacity, match="No valid host"):
        await p.create(
            req.model_copy(update={"name": "floor-3", "reservation_id": lease.reservation_id})
        )
    later = datetime.now(UTC) + timedelta(days=2)
    assert (await p.extend_reservation(lease.lease_id, later)).end == later
    await p.delete_reservation(lease.lease_id)
    assert await p.list_reservations("r1") == []


async def test_injected_throttling_and_errors_are_typed(cloud: Cloud, region_r1: Region) -> None:
    cloud.sim.faults = Faults(rate_limit=1.0, retry_after_s=2.5)
    with pytest.raises(RateLimited) as err:
        await cloud.provider.create(request(region_r1, "r1.A.gp.l"))
    assert err.value.retry_after == timedelta(seconds=2.5)
    app_error = err.value.to_application_error()
    assert app_error.type == "RateLimited" and not app_error.non_retryable
    cloud.sim.faults = Faults()
    cloud.sim.fail_next(Transient("503"))
    with pytest.raises(Transient):
        await cloud.provider.get("x")
    assert InsufficientCapacity("x").to_application_error().non_retryable


async def test_a_lost_hall_fails_its_instances_and_refuses_new_ones(
    cloud: Cloud, region_r1: Region
) -> None:
    inst = await cloud.provider.create(request(region_r1, "r1.C.gp.xl"))
    cloud.sim.fail_hall("C")
    assert (await cloud.provider.get(inst.provider_id)).status is InstanceStatus.ERROR
    with pytest.raises(InsufficientCapacity):
        await cloud.provider.create(request(region_r1, "r1.C.gp.l"))
    cloud.sim.restore_hall("C")
    assert (await cloud.provider.get(inst.provider_id)).status is InstanceStatus.ACTIVE


def test_reclaim_bursts_cluster_within_three_minutes() -> None:
    model = ReclaimModel(base_per_instance_hour=0.0, bursts_per_pool_hour=1.0, burst_fraction=0.5)
    events = model.sample([f"i{n}" for n in range(100)], hours=1.0, rng=random.Random(7))
    assert events, "a one-hour window at one burst per hour should see a burst"
    first = events[0][0]
    assert len([t for t, _ in events if t - first <= 180]) >= 50
