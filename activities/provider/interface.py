"""The narrow provider interface (after Karpenter's CloudProvider).

Contract of every implementation:
- `create` is idempotent on `request.name`: when an instance of that name already exists
  (a retry after a lost response), it is returned and nothing new is made. When two exist
  (names are not unique in Nova: a lost create and its retry can both land), the oldest is
  kept and returned and the others are deleted. An existing instance in ERROR is returned
  as it is: the caller deletes it and counts a shortfall.
- `delete` of an instance that is already gone succeeds: deleting is a desired state.
- `get` raises NotFound for an unknown or deleted instance.
- `list_owned` returns only instances SCO made (SCO metadata), never anyone else's, in
  every status (ERROR and BUILD included: the reconciler and the floor probes need them).
- `create_reservation` names a lease by `leases.lease_name`; `list_reservations` returns
  exactly the region's leases named so (nobody else's), each with its hall, flavor name
  and owner parsed back from the name.
- `free_capacity` is the number of instances of the pool's shape that could start now.
- `pending_reclaims` returns each reclaim decision once, as soon as it is known (with
  `at` when it takes effect later); deciding is the provider's business, noticing and
  deleting is the notice relay's.
- Errors are the typed ProviderError subclasses in `errors`; nothing else escapes.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

#: Metadata key marking an instance as SCO's; its value is the region.
OWNER_KEY = "sco-region"
#: Metadata key naming the hostname an instance must boot with (a Slurm node name).
HOSTNAME_KEY = "sco-hostname"


class InstanceStatus(enum.StrEnum):
    BUILD = "BUILD"
    ACTIVE = "ACTIVE"
    ERROR = "ERROR"
    DELETED = "DELETED"


class CreateRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str  # deterministic: the idempotency key, and the instance id in fleet state
    region: str
    pool_id: str
    hall: str  # availability zone
    flavor: str
    metadata: dict[str, str] = {}
    reservation_id: str | None = None  # boot into a committed (Blazar) reservation
    user_data: str | None = None


class ProviderInstance(BaseModel):
    model_config = ConfigDict(frozen=True)

    provider_id: str
    name: str
    pool_id: str
    hall: str
    status: InstanceStatus
    metadata: dict[str, str] = {}
    host: str | None = None
    created_at: datetime | None = None  # by the provider's clock (orphans get a grace)


class ReservationRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str  # idempotency key
    region: str
    hall: str
    flavor: str
    amount: int = Field(ge=1)
    start: datetime | None = None  # None: now
    end: datetime


class Reservation(BaseModel):
    """One of SCO's leases, listed back with what its name says (`leases.py`)."""

    model_config = ConfigDict(frozen=True)

    reservation_id: str
    lease_id: str
    name: str
    hall: str
    flavor: str  # the region's flavor name (`<sku>.<size>`), not Blazar's private flavor
    amount: int
    status: str  # PENDING, ACTIVE, TERMINATED, ERROR
    end: datetime
    owner: str = ""  # what uses it: a floor's reservation key, `fallback-<acquisition>`
    created_at: datetime | None = None


class ReclaimDecision(BaseModel):
    """The provider takes this instance back (a Blazar lease starting on its host, a
    simulated reclaim); the hall's notice relay turns it into a notice with a deadline."""

    model_config = ConfigDict(frozen=True)

    provider_id: str
    reason: str
    # When the provider takes it back; None: now. A time beyond the region's notice lead
    # (a Blazar host lease that starts later) becomes an early warning now and the hard
    # notice at at - lead.
    at: datetime | None = None


@runtime_checkable
class CloudProvider(Protocol):
    async def create(self, request: CreateRequest) -> ProviderInstance: ...

    async def delete(self, provider_id: str) -> None: ...

    async def get(self, provider_id: str) -> ProviderInstance: ...

    async def list_owned(self, region: str) -> list[ProviderInstance]: ...

    async def free_capacity(self, pool_id: str) -> int: ...

    async def create_reservation(self, request: ReservationRequest) -> Reservation: ...

    async def extend_reservation(self, lease_id: str, end: datetime) -> Reservation: ...

    async def delete_reservation(self, lease_id: str) -> None: ...

    async def list_reservations(self, region: str) -> list[Reservation]: ...

    async def pending_reclaims(self, region: str, hall: str) -> list[ReclaimDecision]:
        """Reclaims decided since the last call (each decision is returned once)."""
        ...
