"""Lifecycle events: what the outbox carries to Kafka and the ledger reads back.

Every acquire/ready/notice/drain/delete of an instance is one event. The event id is
unique and stable across retries, so every consumer can dedupe by it; the Kafka key is
the instance id, so the order of one instance's events holds in its partition.
"""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field


class InstanceState(enum.StrEnum):
    """Lifecycle of an SCO-owned instance in fleet state."""

    REQUESTED = "requested"  # create sent to the provider
    ACTIVE = "active"  # provider reports ACTIVE; spend accrues from here
    NOTICED = "noticed"  # a reclaim notice arrived
    DRAINING = "draining"  # the node agent is draining it
    DELETED = "deleted"  # gone; spend stops here
    FAILED = "failed"  # never became active; no spend


#: States after which an instance accrues no more spend.
TERMINAL_STATES = frozenset({InstanceState.DELETED, InstanceState.FAILED})


class EventKind(enum.StrEnum):
    ACQUIRE = "acquire"
    READY = "ready"
    NOTICE = "notice"
    DRAIN = "drain"
    DELETE = "delete"
    FAIL = "fail"


#: The state an instance enters with each event kind.
STATE_AFTER: dict[EventKind, InstanceState] = {
    EventKind.ACQUIRE: InstanceState.REQUESTED,
    EventKind.READY: InstanceState.ACTIVE,
    EventKind.NOTICE: InstanceState.NOTICED,
    EventKind.DRAIN: InstanceState.DRAINING,
    EventKind.DELETE: InstanceState.DELETED,
    EventKind.FAIL: InstanceState.FAILED,
}


class CapacityType(enum.StrEnum):
    RECLAIMABLE = "reclaimable"
    COMMITTED = "committed"


class LifecycleEvent(BaseModel):
    """One lifecycle event, as published to Kafka (JSON) and stored in the ledger."""

    model_config = ConfigDict(frozen=True)

    event_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    kind: EventKind
    occurred_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    instance_id: str
    region: str
    pool_id: str
    hall: str
    sku: str
    size: str
    capacity_type: CapacityType
    workload: str
    tier: int = Field(ge=1, le=3)
    price_per_hour: float = Field(ge=0)
    reason: str = ""

    def topic(self) -> str:
        return lifecycle_topic(self.region)


def lifecycle_topic(region: str) -> str:
    """One lifecycle topic per region: regions share no event path."""
    return f"sco.{region}.lifecycle"


def region_topics(region: str) -> list[str]:
    """Every topic of one region: lifecycle events and decisions."""
    from activities.decisions import decisions_topic

    return [lifecycle_topic(region), decisions_topic(region)]
