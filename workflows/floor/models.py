"""Inputs, outputs and messages of the floor keeper.

New fields always get defaults, so histories recorded before them still decode.
"""

from __future__ import annotations

import enum
from datetime import datetime

from pydantic import BaseModel, Field

from activities.floor.models import floor_prefix
from activities.provider.interface import Reservation
from activities.provider.leases import lease_name

#: Acquisitions a floor keeper starts are recorded under this partition: the region
#: controller reads only its own partitions (0..n-1), so it never counts a floor's
#: launches as outstanding reclaimable demand.
FLOOR_PARTITION = -1

#: Handler names, used by the workflow's decorators and by every client. Running
#: workflows answer to these strings: never rename one.
HALL_LOST_SIGNAL = "hall_lost"
HALL_RESTORED_SIGNAL = "hall_restored"
STATUS_QUERY = "status"


def reservation_name(region: str, contract: str, hall: str, generation: int) -> str:
    """The floor's key of one reservation (`floor-<region>-<contract>-<hall>-<gen>`): the
    owner part of its lease name, and the prefix of the acquisitions that boot into it."""
    return f"{floor_prefix(region, contract)}{hall}-{generation}"


def floor_lease_name(region: str, contract: str, hall: str, flavor: str, generation: int) -> str:
    """Idempotent Blazar lease name: a retried create finds the same reservation."""
    return lease_name(region, hall, flavor, reservation_name(region, contract, hall, generation))


def reservation_key(res: Reservation) -> str:
    """The floor's key of a reservation: its owner; leases recorded before the one naming
    scheme were named by the key itself."""
    return res.owner or res.name


def reservation_of(acquisition_id: str) -> str:
    """The reservation an acquisition of the floor booted into (its id minus the nonce)."""
    return acquisition_id.rsplit("-", 1)[0]


def generation_of(name: str, prefix: str) -> int | None:
    """The generation of one of the floor's reservation names, None for another name."""
    if not name.startswith(prefix):
        return None
    _, _, gen = name[len(prefix) :].rpartition("-")
    return int(gen) if gen.isdigit() else None


class FloorState(enum.StrEnum):
    HOLDING = "holding"  # the floor is whole and spread by the rules
    REBUILDING = "rebuilding"  # a hall was lost; its share is being rebuilt elsewhere
    DEGRADED = "degraded"  # short of the floor, or not within the spread rules
    REBALANCING = "rebalancing"  # a hall is back: moving toward the spread, make-before-break


class HallEvent(BaseModel):
    hall: str = Field(min_length=1)
    operator: str = Field(default="operator", min_length=1)
    reason: str = ""
    # The operator's authenticated identity (client-certificate subject), "" without one.
    identity: str = ""


class HallLoss(BaseModel):
    hall: str
    detected: bool  # True: by probes (probes may lift it); False: an operator's word
    by: str
    reason: str
    since: datetime
    identity: str = ""  # the operator's authenticated identity, "" without one


class FloorConfig(BaseModel):
    tick_seconds: float = Field(default=60.0, gt=0)
    probe_seconds: float = Field(default=15.0, gt=0)
    # A hall is lost when >= lost_fraction of the floor's instances in it are ERROR or
    # gone on lost_probes probes in a row; a detected loss lifts after clean_probes.
    lost_fraction: float = Field(default=0.5, gt=0, le=1)
    lost_probes: int = Field(default=2, ge=1)
    clean_probes: int = Field(default=3, ge=1)
    lease_hours: float = Field(default=24.0, gt=0)
    renew_before_hours: float = Field(default=6.0, ge=0)
    # Seconds between ACTIVE polls of the floor's acquisitions and reservation waits.
    poll_seconds: float = Field(default=1.0, gt=0)
    reservation_poll_seconds: float = Field(default=2.0, gt=0)
    # A floor boot still in BUILD after this long is deleted and rebuilt (a shortfall).
    build_timeout_seconds: float = Field(default=900.0, gt=0)
    # Wake-ups (ticks and probes) per run before continue-as-new.
    wakeups_per_run: int = Field(default=500, ge=1)
    # ... or after this many history events: far below Temporal's 10,240-event warning.
    max_history_events: int = Field(default=2000, ge=100)


class FloorInput(BaseModel):
    region: str
    contract: str
    config: FloorConfig = FloorConfig()
    # Carried over continue-as-new.
    lost: dict[str, HallLoss] = {}
    bad_probes: dict[str, int] = {}
    clean_probes: dict[str, int] = {}
    generation: int = 0
    budget_counter: int = 0
    rounds: int = 0
    state: FloorState = FloorState.HOLDING
    reason: str = ""
    last_rebuild_seconds: float | None = None
    rebuild_since: datetime | None = None
    recorded_degraded: str = ""


class FloorStatus(BaseModel):
    contract: str
    region: str
    floor_units: int = 0
    held_units_by_hall: dict[str, int] = {}
    target_units_by_hall: dict[str, int] = {}
    lost_halls: list[str] = []
    losses: list[HallLoss] = []
    state: FloorState = FloorState.HOLDING
    last_rebuild_seconds: float | None = None
    reason: str = ""
    bundle_serial: int | None = None
    flavor: str = ""
    rounds: int = 0
    pending: bool = False  # a signal arrived that the keeper has not acted on yet
