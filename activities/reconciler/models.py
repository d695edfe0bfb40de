"""What the region's reconciler reads (provider and fleet state side by side) and what its
activities take. The comparison itself is pure code in `workflows/reconciler/compare.py`."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from activities.events import InstanceState
from activities.provider.interface import ProviderInstance, Reservation


class FleetEntry(BaseModel):
    """One live (not DELETED/FAILED) instance of fleet state."""

    instance_id: str
    state: InstanceState
    provider_id: str | None = None
    acquisition_id: str = ""
    state_changed_at: datetime


class ReconcileSnapshotInput(BaseModel):
    region: str


class ReconcileSnapshot(BaseModel):
    region: str
    taken_at: datetime
    servers: list[ProviderInstance] = []  # SCO's, by metadata
    leases: list[Reservation] = []  # SCO's, by name
    fleet: list[FleetEntry] = []


class MarkLostInput(BaseModel):
    region: str
    instance_id: str
    provider_id: str
    reason: str


class MarkLostResult(BaseModel):
    marked: bool  # False: on a second look the instance is there, or the row moved on
