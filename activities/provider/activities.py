"""Provider activities: bound methods of a class built with its CloudProvider.

Every ProviderError leaves as an ApplicationError whose type is the error's class name
and whose retryability is the error's (RateLimited carries its Retry-After as the next
retry delay). Waiting for ACTIVE heartbeats each poll, so a lost worker is noticed within
the heartbeat timeout and the retry resumes the wait, not the create.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.provider.errors import InsufficientCapacity, NotFound, ProviderError
from activities.provider.interface import (
    CloudProvider,
    CreateRequest,
    InstanceStatus,
    ProviderInstance,
    Reservation,
    ReservationRequest,
)

T = TypeVar("T")


class InstanceRef(BaseModel):
    provider_id: str


class WaitActiveInput(BaseModel):
    provider_id: str
    poll_seconds: float = 1.0
    # Still BUILD at this moment: given up (InsufficientCapacity). None: no bound here.
    build_deadline: datetime | None = None


class PoolRef(BaseModel):
    pool_id: str


class FreeCapacity(BaseModel):
    pool_id: str
    free: int


class ExtendReservationInput(BaseModel):
    lease_id: str
    end: datetime


class LeaseRef(BaseModel):
    lease_id: str


class WaitReservationInput(BaseModel):
    region: str
    lease_id: str
    poll_seconds: float = 2.0


class RegionRef(BaseModel):
    region: str


class InstanceList(BaseModel):
    instances: list[ProviderInstance]


class ReservationList(BaseModel):
    reservations: list[Reservation]


async def _typed(call: Awaitable[T]) -> T:
    try:
        return await call
    except ProviderError as exc:
        raise exc.to_application_error() from exc


class ProviderActivities:
    def __init__(self, provider: CloudProvider) -> None:
        self._provider = provider

    @activity.defn(name="provider.create_instance")
    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        return await _typed(self._provider.create(request))

    @activity.defn(name="provider.wait_active")
    async def wait_active(self, inp: WaitActiveInput) -> ProviderInstance:
        """Poll until ACTIVE. ERROR is a capacity failure (the boot found no host), and so
        is a boot still in BUILD at the deadline (the caller deletes it either way)."""
        polls = 0
        while True:
            inst = await _typed(self._provider.get(inp.provider_id))
            if inst.status is InstanceStatus.ACTIVE:
                return inst
            if inst.status is InstanceStatus.ERROR:
                raise InsufficientCapacity(
                    f"{inst.name} went to ERROR while booting"
                ).to_application_error()
            if inp.build_deadline is not None and datetime.now(UTC) >= inp.build_deadline:
                raise InsufficientCapacity(
                    f"{inst.name} still {inst.status.value} at {inp.build_deadline:%H:%M:%S}"
                ).to_application_error()
            polls += 1
            activity.heartbeat(polls)
            await asyncio.sleep(inp.poll_seconds)

    @activity.defn(name="provider.delete_instance")
    async def delete_instance(self, ref: InstanceRef) -> None:
        await _typed(self._provider.delete(ref.provider_id))

    @activity.defn(name="provider.get_instance")
    async def get_instance(self, ref: InstanceRef) -> ProviderInstance:
        return await _typed(self._provider.get(ref.provider_id))

    @activity.defn(name="provider.list_owned")
    async def list_owned(self, ref: RegionRef) -> InstanceList:
        return InstanceList(instances=await _typed(self._provider.list_owned(ref.region)))

    @activity.defn(name="provider.free_capacity")
    async def free_capacity(self, ref: PoolRef) -> FreeCapacity:
        free = await _typed(self._provider.free_capacity(ref.pool_id))
        return FreeCapacity(pool_id=ref.pool_id, free=free)

    @activity.defn(name="provider.create_reservation")
    async def create_reservation(self, request: ReservationRequest) -> Reservation:
        return await _typed(self._provider.create_reservation(request))

    @activity.defn(name="provider.extend_reservation")
    async def extend_reservation(self, inp: ExtendReservationInput) -> Reservation:
        return await _typed(self._provider.extend_reservation(inp.lease_id, inp.end))

    @activity.defn(name="provider.delete_reservation")
    async def delete_reservation(self, ref: LeaseRef) -> None:
        await _typed(self._provider.delete_reservation(ref.lease_id))

    @activity.defn(name="provider.wait_reservation_active")
    async def wait_reservation_active(self, inp: WaitReservationInput) -> Reservation:
        """Poll until the lease is ACTIVE (Blazar starts leases on its own poll, ~10 s);
        a lease that ended or failed is a capacity failure."""
        polls = 0
        while True:
            leases = await _typed(self._provider.list_reservations(inp.region))
            lease = next((r for r in leases if r.lease_id == inp.lease_id), None)
            if lease is None:
                raise NotFound(f"lease {inp.lease_id} is gone").to_application_error()
            if lease.status == "ACTIVE":
                return lease
            if lease.status in ("ERROR", "TERMINATED"):
                raise InsufficientCapacity(
                    f"lease {inp.lease_id} is {lease.status}"
                ).to_application_error()
            polls += 1
            activity.heartbeat(polls)
            await asyncio.sleep(inp.poll_seconds)

    @activity.defn(name="provider.list_reservations")
    async def list_reservations(self, ref: RegionRef) -> ReservationList:
        return ReservationList(
            reservations=await _typed(self._provider.list_reservations(ref.region))
        )


def all_activities(acts: ProviderActivities) -> list[Callable[..., Any]]:
    return [
        acts.create_instance,
        acts.wait_active,
        acts.delete_instance,
        acts.get_instance,
        acts.list_owned,
        acts.free_capacity,
        acts.create_reservation,
        acts.extend_reservation,
        acts.delete_reservation,
        acts.wait_reservation_active,
        acts.list_reservations,
    ]


__all__ = ["ApplicationError", "ProviderActivities", "all_activities"]
