"""What the lifecycle workflow's activities take and return, and the names of its things:
the workflow imports them from here."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from planning.lifecycle import ContractLife

#: Replacements the lifecycle workflow starts: their acquisitions, and so their instances.
LIFECYCLE_PREFIX = "life-"
#: Its acquisitions are recorded under this partition: no controller partition reads them
#: as its own outstanding work (the floor keeper's are -1).
LIFECYCLE_PARTITION = -2
#: Who asks the notice relay for a voluntary drain.
REQUESTED_BY = "sco-lifecycle"


def lifecycle_workflow_id(region: str) -> str:
    return f"lifecycle-{region}"


class LifecycleSnapshotInput(BaseModel):
    region: str


class LifecycleSnapshot(BaseModel):
    region: str
    bundle_serial: int | None = None
    problem: str = ""  # why nothing can be planned (no bundle, no region file)
    # The region's notice lead: how long a drain has before its node goes.
    lead_seconds: float = 0.0
    contracts: list[ContractLife] = []


class DrainInput(BaseModel):
    region: str
    hall: str
    instance_id: str
    reason: str = Field(default="voluntary disruption", max_length=200)


class DrainTold(BaseModel):
    """`told`: the hall's notice relay noticed the instance (its agent drains it within
    `lead_seconds`); else `why` not (the instance is no longer active, say)."""

    told: bool
    lead_seconds: float = 0.0
    why: str = ""
    noticed_at: datetime | None = None
    # Not told because nobody answered for the hall (NATS or its relay away), not because
    # of the instance: the hall's other drains would fail too for a while.
    unavailable: bool = False


class InstanceLookup(BaseModel):
    instance_id: str


class InstanceRef(BaseModel):
    """An instance as fleet state has it now; `found` False: not there."""

    instance_id: str
    found: bool = False
    state: str = ""
    pool_id: str = ""
    provider_id: str | None = None
    price_per_hour: float = 0.0


class FallbackLeaseInput(BaseModel):
    """A fallback instance the lifecycle has just deleted (its row is DELETED)."""

    region: str
    instance_id: str


class FallbackLeases(BaseModel):
    """Its acquisition's Blazar leases in its hall and flavor that no live instance of that
    acquisition boots into any more: committed spend nothing uses."""

    lease_ids: list[str] = []
