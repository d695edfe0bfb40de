"""One contract suite for every CloudProvider implementation.

Runs against the in-process simulator and the simulator service over real NATS (what
workers, relays and agents share), and against the OpenStack implementation on the real
test cloud (marker `testcloud`) when it is up.
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

from activities.provider.errors import (
    InsufficientCapacity,
    NotFound,
    Permanent,
    RateLimited,
    Transient,
)
from activities.provider.interface import (
    CloudProvider,
    CreateRequest,
    InstanceStatus,
    ProviderInstance,
    Reservation,
    ReservationRequest,
)
from activities.provider.leases import lease_name
from activities.provider.sim_service import SimulatorClient, serve
from activities.provider.simulator import Faults, ReclaimModel, SimulatedCloud
from contracts.region import Region
from tests.support.testcloud import provider_or_skip
from tests.support.wait import eventually_async
from tests.support.worker_nats import NATS_URL


@dataclass
class Cloud:
    provider: CloudProvider
    sim: SimulatedCloud | None  # the simulated cloud behind it, for fault control

    def simulated(self) -> SimulatedCloud:
        if self.sim is None:
            pytest.skip("fault injection exists only in the simulator")
        return self.sim


@pytest.fixture(
    params=["in-process", "service", pytest.param("openstack", marks=pytest.mark.testcloud)]
)
async def cloud(request: pytest.FixtureRequest, region_r1: Region) -> AsyncIterator[Cloud]:
    if request.param == "openstack":
        provider = provider_or_skip()
        yield Cloud(provider, None)
        for inst in await provider.list_owned("r1"):
            if inst.name.startswith(PREFIX):
                await provider.delete(inst.provider_id)
        for res in await provider.list_reservations("r1"):
            if res.owner.startswith(TAG):
                await provider.delete_reservation(res.lease_id)
        return
    sim = SimulatedCloud(region_r1, clock=lambda: 0.0)
    if request.param == "in-process":
        yield Cloud(sim, sim)
        return
    prefix = f"test{uuid.uuid4().hex[:8]}"  # no other test run answers our requests
    nc = await nats.connect(NATS_URL)
    server = asyncio.create_task(serve(sim, nc, prefix=prefix))
    client = SimulatorClient(NATS_URL, "r1", prefix=prefix)

    async def answering() -> bool:
        await client.list_owned("r1")  # no responders until the server has subscribed
        return True

    try:
        await eventually_async(answering, timeout=10, what="the simulator service answering")
        yield Cloud(client, sim)
    finally:
        server.cancel()
        await client.close()
        await nc.close()


TAG = f"ct{uuid.uuid4().hex[:6]}"
PREFIX = f"sco-r1-{TAG}-"


def lease_request(hall: str, flavor: str, owner: str, amount: int = 1) -> ReservationRequest:
    return ReservationRequest(
        name=lease_name("r1", hall, flavor, f"{TAG}-{owner}"),
        region="r1",
        hall=hall,
        flavor=flavor,
        amount=amount,
        end=datetime.now(UTC) + timedelta(days=1),
    )


async def until_active(p: CloudProvider, lease: Reservation) -> Reservation:
    if lease.status == "ACTIVE":
        return lease

    async def active() -> Reservation | None:
        now = next(r for r in await p.list_reservations("r1") if r.lease_id == lease.lease_id)
        return now if now.status == "ACTIVE" else None

    # A real Blazar starts leases on a ~10 s poll.
    return await eventually_async(
        active, timeout=120, what=f"lease {lease.name} ACTIVE", every=0.2, first=0.2
    )


def request(region: Region, pool_id: str, name: str | None = None) -> CreateRequest:
    pool = region.pool(pool_id)
    return CreateRequest(
        name=name or f"{PREFIX}{uuid.uuid4().hex[:8]}",
        region=region.id,
        pool_id=pool_id,
        hall=pool.hall,
        flavor=pool.flavor,
    )


async def launch(provider: CloudProvider, req: CreateRequest) -> ProviderInstance:
    """Create and wait for ACTIVE; a real cloud reports NoValidHost while booting, the
    simulator at create: both surface as InsufficientCapacity."""

    def booted(inst: ProviderInstance) -> ProviderInstance | None:
        if inst.status is InstanceStatus.ERROR:
            raise InsufficientCapacity(f"{req.name} went to ERROR")
        return inst if inst.status is InstanceStatus.ACTIVE else None

    inst = await provider.create(req)
    if up := booted(inst):
        return up

    async def active() -> ProviderInstance | None:
        return booted(await provider.get(inst.provider_id))

    # retrying=(): ERROR and the provider's errors end the wait at once, as they did.
    return await eventually_async(
        active, timeout=120, what=f"{req.name} ACTIVE", every=0.2, first=0.2, retrying=()
    )


async def test_implementations_are_cloud_providers(cloud: Cloud) -> None:
    assert isinstance(cloud.provider, CloudProvider)


async def test_create_get_list_delete(cloud: Cloud, region_r1: Region) -> None:
    p = cloud.provider
    created = await launch(p, request(region_r1, "r1.B.gp.l"))
    assert created.hall == "B" and created.pool_id == "r1.B.gp.l"  # the AZ picks the hall
    assert (await p.get(created.provider_id)).status is InstanceStatus.ACTIVE
    assert created.provider_id in {i.provider_id for i in await p.list_owned("r1")}
    assert await p.list_owned("r2") == []
    await p.delete(created.provider_id)
    await p.delete(created.provider_id)  # already gone: still success

    async def gone() -> bool:
        try:
            await p.get(created.provider_id)
        except NotFound:
            return True
        return False

    # A real cloud deletes asynchronously.
    await eventually_async(
        gone, timeout=60, what=f"{created.provider_id} deleted", every=0.2, retrying=()
    )
    with pytest.raises(NotFound):
        await p.get(created.provider_id)


async def test_a_retried_create_makes_no_duplicate(cloud: Cloud, region_r1: Region) -> None:
    req = request(region_r1, "r1.A.cpu.xl")
    first = await cloud.provider.create(req)
    again = await cloud.provider.create(req)  # the response to the first was "lost"
    assert again.provider_id == first.provider_id
    assert [i.provider_id for i in await cloud.provider.list_owned("r1") if i.name == req.name] == [
        first.provider_id
    ]


async def test_an_exhausted_pool_raises_insufficient_capacity(
    cloud: Cloud, region_r1: Region
) -> None:
    pool_id = "r1.D.gpu-a.4xl"  # the biggest VM: few fit, in the simulator and the test cloud
    with pytest.raises(InsufficientCapacity):
        for _ in range(region_r1.pool(pool_id).reclaimable_units + 1):
            await launch(cloud.provider, request(region_r1, pool_id))
    assert await cloud.provider.free_capacity(pool_id) == 0


async def test_a_reservation_admits_its_amount_and_no_more(cloud: Cloud, region_r1: Region) -> None:
    p = cloud.provider
    lease = await until_active(
        p, await p.create_reservation(lease_request("A", "cpu.xl", "floor-A", amount=2))
    )
    req = request(region_r1, "r1.A.cpu.xl")
    for n in range(2):
        inst = await launch(
            p,
            req.model_copy(
                update={"name": f"{PREFIX}floor-{n}", "reservation_id": lease.reservation_id}
            ),
        )
        assert inst.hall == "A"
    with pytest.raises(InsufficientCapacity):  # the third: NoValidHost
        await launch(
            p,
            req.model_copy(
                update={"name": f"{PREFIX}floor-3", "reservation_id": lease.reservation_id}
            ),
        )
    later = datetime.now(UTC) + timedelta(days=2)
    extended = await p.extend_reservation(lease.lease_id, later)
    assert extended.end.replace(second=0, microsecond=0) == later.replace(second=0, microsecond=0)
    await p.delete_reservation(lease.lease_id)

    async def lease_gone() -> bool:
        return all(r.lease_id != lease.lease_id for r in await p.list_reservations("r1"))

    await eventually_async(
        lease_gone, timeout=60, what=f"lease {lease.lease_id} deleted", every=0.2, retrying=()
    )
    assert all(r.lease_id != lease.lease_id for r in await p.list_reservations("r1"))
    # Idempotent: a retried delete (or a cleanup after the keeper's own) finds it gone.
    await p.delete_reservation(lease.lease_id)


async def test_a_lease_is_listed_back_with_its_hall_flavor_name_and_owner(
    cloud: Cloud,
) -> None:
    """What the floor keeper plans with: hall and the region's flavor name (not Blazar's
    flavor id), the owner, and only this region's leases named by the one scheme."""
    p = cloud.provider
    req = lease_request("C", "mem.xl", "floor-r1-x-C-1")
    made = await p.create_reservation(req)
    again = await p.create_reservation(req)  # idempotent on the name
    assert again.lease_id == made.lease_id
    listed = await until_active(p, made)
    assert (listed.name, listed.hall, listed.flavor, listed.owner, listed.amount) == (
        req.name,
        "C",
        "mem.xl",
        f"{TAG}-floor-r1-x-C-1",
        1,
    )
    assert all(r.lease_id != made.lease_id for r in await p.list_reservations("r2"))
    with pytest.raises(Permanent):  # a lease it could not list back is never made
        await p.create_reservation(req.model_copy(update={"name": f"floor-r1-{TAG}-C-1"}))
    with pytest.raises(Permanent):  # Blazar keeps 80 characters
        await p.create_reservation(req.model_copy(update={"name": req.name + "x" * 80}))
    await p.delete_reservation(made.lease_id)


async def test_an_error_server_is_listed_and_returned_to_a_retried_create(
    cloud: Cloud, region_r1: Region
) -> None:
    """A failed boot stays visible: the caller deletes it and counts a shortfall."""
    pool_id = "r1.D.gpu-a.4xl"
    req = request(region_r1, pool_id)
    if cloud.sim is not None:
        cloud.sim.fail_boots(1)
        pid = (await cloud.provider.create(req)).provider_id
    else:  # a real cloud: boot until the hall has no room left (NoValidHost -> ERROR)
        for _ in range(region_r1.pool(pool_id).reclaimable_units + 2):
            req = request(region_r1, pool_id)
            try:
                await launch(cloud.provider, req)
            except InsufficientCapacity:
                break
        pid = next(
            i for i in await cloud.provider.list_owned("r1") if i.name == req.name
        ).provider_id

    async def built() -> ProviderInstance | None:
        now = await cloud.provider.get(pid)
        return now if now.status is not InstanceStatus.BUILD else None

    failed = await eventually_async(
        built, timeout=60, what=f"{pid} out of BUILD", every=0.2, retrying=()
    )
    assert failed.status is InstanceStatus.ERROR
    owned = {i.provider_id: i.status for i in await cloud.provider.list_owned("r1")}
    assert owned[failed.provider_id] is InstanceStatus.ERROR
    again = await cloud.provider.create(req)
    assert (again.provider_id, again.status) == (failed.provider_id, InstanceStatus.ERROR)


async def test_a_duplicate_server_for_one_name_is_deleted(cloud: Cloud, region_r1: Region) -> None:
    """Nova names are not unique: a lost create and its retry can both land. The provider
    keeps the oldest and deletes the other (only a real cloud can hold two)."""
    if cloud.sim is not None:
        pytest.skip("the simulator's names are unique")
    from activities.provider.openstack import OpenStackProvider

    assert isinstance(cloud.provider, OpenStackProvider)
    req = request(region_r1, "r1.B.gp.l")
    first = await cloud.provider.create(req)
    conn = cloud.provider.connection
    flavor = await asyncio.to_thread(conn.compute.find_flavor, "gp.l", ignore_missing=False)
    image = await asyncio.to_thread(conn.image.find_image, "sco-image", ignore_missing=False)
    twin = await asyncio.to_thread(
        conn.compute.create_server,
        name=req.name,
        flavor_id=flavor.id,
        image_id=image.id,
        networks="none",
        availability_zone="B",
        metadata={"sco-region": "r1", "sco-pool": req.pool_id},
    )
    again = await cloud.provider.create(req)
    # The oldest is kept (Nova's created_at has one-second resolution: ties go by id, so
    # racing creators still agree on one).
    assert again.provider_id in {first.provider_id, twin.id}
    assert (await cloud.provider.create(req)).provider_id == again.provider_id

    async def one_left() -> list[str]:
        left = [i.provider_id for i in await cloud.provider.list_owned("r1") if i.name == req.name]
        assert left == [again.provider_id], left
        return left

    await eventually_async(
        one_left,
        timeout=60,
        what=f"one of {first.provider_id}, {twin.id} gone",
        every=0.2,
        retrying=AssertionError,
    )


async def test_injected_throttling_and_errors_are_typed(cloud: Cloud, region_r1: Region) -> None:
    sim = cloud.simulated()
    sim.faults = Faults(rate_limit=1.0, retry_after_s=2.5)
    with pytest.raises(RateLimited) as err:
        await cloud.provider.create(request(region_r1, "r1.A.gp.l"))
    assert err.value.retry_after == timedelta(seconds=2.5)
    app_error = err.value.to_application_error()
    assert app_error.type == "RateLimited" and not app_error.non_retryable
    sim.faults = Faults()
    sim.fail_next(Transient("503"))
    with pytest.raises(Transient):
        await cloud.provider.get("x")
    assert InsufficientCapacity("x").to_application_error().non_retryable


async def test_a_lost_hall_fails_its_instances_and_refuses_new_ones(
    cloud: Cloud, region_r1: Region
) -> None:
    sim = cloud.simulated()
    inst = await cloud.provider.create(request(region_r1, "r1.C.gp.xl"))
    sim.fail_hall("C")
    assert (await cloud.provider.get(inst.provider_id)).status is InstanceStatus.ERROR
    with pytest.raises(InsufficientCapacity):
        await cloud.provider.create(request(region_r1, "r1.C.gp.l"))
    sim.restore_hall("C")
    assert (await cloud.provider.get(inst.provider_id)).status is InstanceStatus.ACTIVE


def test_reclaim_bursts_cluster_within_three_minutes() -> None:
    model = ReclaimModel(base_per_instance_hour=0.0, bursts_per_pool_hour=1.0, burst_fraction=0.5)
    events = model.sample([f"i{n}" for n in range(100)], hours=1.0, rng=random.Random(7))
    assert events, "a one-hour window at one burst per hour should see a burst"
    first = events[0][0]
    assert len([t for t, _ in events if t - first <= 180]) >= 50
