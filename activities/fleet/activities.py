"""Fleet-state activities: bound methods of a class built with its connection pool."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.events import EventKind
from activities.fleet.repository import (
    FleetRepository,
    InstanceSpec,
    InvalidTransition,
    UnknownInstance,
)
from contracts.region import RegionFileError, load_region


class SyncPoolsInput(BaseModel):
    region: str


class SyncPoolsOutput(BaseModel):
    region: str
    pools: int
    changed: int


class RecordAcquireInput(BaseModel):
    spec: InstanceSpec
    reason: str = ""


class RecordEventInput(BaseModel):
    instance_id: str
    kind: EventKind
    reason: str = ""
    provider_id: str | None = None


class RecordOutput(BaseModel):
    written: bool  # False: already recorded (a retry); nothing new was written
    event_id: str | None = None


class FleetActivities:
    def __init__(self, repo: FleetRepository, regions_dir: Path) -> None:
        self._repo = repo
        self._regions_dir = regions_dir

    @activity.defn(name="fleet.sync_pools")
    def sync_pools(self, inp: SyncPoolsInput) -> SyncPoolsOutput:
        try:
            region = load_region(self._regions_dir / f"{inp.region}.toml")
        except (RegionFileError, FileNotFoundError) as exc:
            raise ApplicationError(str(exc), type="RegionFileError", non_retryable=True) from exc
        changed = self._repo.sync_pools(region)
        return SyncPoolsOutput(region=region.id, pools=len(region.pools), changed=changed)

    @activity.defn(name="fleet.record_acquire")
    def record_acquire(self, inp: RecordAcquireInput) -> RecordOutput:
        event = self._repo.record_acquire(inp.spec, inp.reason)
        return RecordOutput(
            written=event is not None, event_id=str(event.event_id) if event else None
        )

    @activity.defn(name="fleet.record_event")
    def record_event(self, inp: RecordEventInput) -> RecordOutput:
        try:
            event = self._repo.record_event(
                inp.instance_id, inp.kind, reason=inp.reason, provider_id=inp.provider_id
            )
        except (InvalidTransition, UnknownInstance) as exc:
            raise ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True) from exc
        return RecordOutput(
            written=event is not None, event_id=str(event.event_id) if event else None
        )
