"""One contract suite for every CloudProvider implementation.

The simulator runs here always; the OpenStack implementation joins the `provider`
parametrisation when the real test cloud is up (issue 4, `testcloud` marker).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest

from activities.provider.errors import (
    InsufficientCapacity,
    NotFound,
    RateLimited,
    Transient,
)
from activities.provider.interface import (
    CloudProvider,
    CreateRequest,
    InstanceStatus,
    ReservationRequest,
)
from activities.provider.simulator import Faults, ReclaimModel, SimulatedCloud
from contracts.region import Region

T = TypeVar("T")


@pytest.fixture
def provider(region_r1: Region) -> SimulatedCloud:
    return SimulatedCloud(region_r1, clock=lambda: 0.0)


def request(region: Region, pool_id: str, name: str | None = None) -> CreateRequest:
    pool = region.pool(pool_id)
    return CreateRequest(
        name=name or f"sco-{uuid.uuid4().hex[:10]}",
        region=region.id,
        pool_id=pool_id,
        hall=pool.hall,
        flavor=pool.flavor,
    )


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_the_simulator_is_a_cloud_provider(provider: SimulatedCloud) -> None:
    assert isinstance(provider, CloudProvider)


def test_create_get_list_delete(provider: SimulatedCloud, region_r1: Region) -> None:
    pool_id = "r1.B.gp.l"
    created = run(provider.create(request(region_r1, pool_id)))
    assert created.hall == "B" and created.pool_id == pool_id  # the AZ picks the hall
    assert run(provider.get(created.provider_id)).status is InstanceStatus.ACTIVE
    assert created.provider_id in {i.provider_id for i in run(provider.list_owned("r1"))}
    assert run(provider.list_owned("r2")) == []
    run(provider.delete(created.provider_id))
    run(provider.delete(created.provider_id))  # already gone: still success
    with pytest.raises(NotFound):
        run(provider.get(created.provider_id))


def test_a_retried_create_makes_no_duplicate(provider: SimulatedCloud, region_r1: Region) -> None:
    req = request(region_r1, "r1.A.cpu.xl")
    first = run(provider.create(req))
    again = run(provider.create(req))  # the response to the first was "lost"
    assert again.provider_id == first.provider_id
    assert len(run(provider.list_owned("r1"))) == 1


def test_an_exhausted_pool_raises_insufficient_capacity(
    provider: SimulatedCloud, region_r1: Region
) -> None:
    pool_id = "r1.D.bm-gpu.4xl"
    units = region_r1.pool(pool_id).reclaimable_units
    for _ in range(units):
        run(provider.create(request(region_r1, pool_id)))
    assert run(provider.free_capacity(pool_id)) == 0
    with pytest.raises(InsufficientCapacity):
        run(provider.create(request(region_r1, pool_id)))


def test_a_reservation_admits_its_amount_and_no_more(
    provider: SimulatedCloud, region_r1: Region
) -> None:
    lease = run(
        provider.create_reservation(
            ReservationRequest(
                name="floor-search-api-r1-A",
                region="r1",
                hall="A",
                flavor="cpu.xl",
                amount=2,
                end=datetime.now(UTC) + timedelta(days=1),
            )
        )
    )
    assert lease.status == "ACTIVE"
    req = request(region_r1, "r1.A.cpu.xl")
    for n in range(2):
        run(
            provider.create(
                req.model_copy(
                    update={"name": f"floor-{n}", "reservation_id": lease.reservation_id}
                )
            )
        )
    with pytest.raises(InsufficientCapacity, match="No valid host"):
        run(
            provider.create(
                req.model_copy(update={"name": "floor-3", "reservation_id": lease.reservation_id})
            )
        )
    later = datetime.now(UTC) + timedelta(days=2)
    assert run(provider.extend_reservation(lease.lease_id, later)).end == later
    run(provider.delete_reservation(lease.lease_id))
    assert run(provider.list_reservations("r1")) == []


def test_injected_throttling_and_errors_are_typed(region_r1: Region) -> None:
    cloud = SimulatedCloud(
        region_r1, faults=Faults(rate_limit=1.0, retry_after_s=2.5), clock=lambda: 0.0
    )
    with pytest.raises(RateLimited) as err:
        run(cloud.create(request(region_r1, "r1.A.gp.l")))
    assert err.value.retry_after == timedelta(seconds=2.5)
    app_error = err.value.to_application_error()
    assert app_error.type == "RateLimited" and not app_error.non_retryable
    cloud.faults = Faults()
    cloud.fail_next(Transient("503"))
    with pytest.raises(Transient):
        run(cloud.get("x"))
    assert InsufficientCapacity("x").to_application_error().non_retryable


def test_a_lost_hall_fails_its_instances_and_refuses_new_ones(
    provider: SimulatedCloud, region_r1: Region
) -> None:
    inst = run(provider.create(request(region_r1, "r1.C.gp.xl")))
    provider.fail_hall("C")
    assert run(provider.get(inst.provider_id)).status is InstanceStatus.ERROR
    with pytest.raises(InsufficientCapacity):
        run(provider.create(request(region_r1, "r1.C.gp.l")))
    provider.restore_hall("C")
    assert run(provider.get(inst.provider_id)).status is InstanceStatus.ACTIVE


def test_reclaim_bursts_cluster_within_three_minutes() -> None:
    model = ReclaimModel(base_per_instance_hour=0.0, bursts_per_pool_hour=1.0, burst_fraction=0.5)
    events = model.sample([f"i{n}" for n in range(100)], hours=1.0, rng=random.Random(7))
    assert events, "a one-hour window at one burst per hour should see a burst"
    first = events[0][0]
    burst = [t for t, _ in events if t - first <= 180]
    assert len(burst) >= 50
