"""What the floor keeper's activities take and return (its snapshot and hall probes), and the
names of a floor's things: the keeper workflow imports them from here."""

from __future__ import annotations

from pydantic import BaseModel, Field

from activities.events import InstanceState
from activities.provider.interface import Reservation


def floor_workflow_id(region: str, contract: str) -> str:
    return f"floor-{region}-{contract}"


def floor_prefix(region: str, contract: str) -> str:
    """Prefix of every reservation, acquisition and instance name of one floor."""
    return f"{floor_workflow_id(region, contract)}-"


class FloorSnapshotInput(BaseModel):
    region: str
    contract: str


class FloorShape(BaseModel):
    """One instance shape the contract may hold its floor on."""

    sku: str
    size: str
    flavor: str
    vcpu: int
    memory_gib: int
    gpus: int = 0
    units_per_instance: int = Field(ge=1)
    pool_ids: dict[str, str] = {}  # hall -> pool id of this shape


class HallCapacity(BaseModel):
    """Committed capacity of one hall nobody has reserved yet, and its price."""

    free_vcpu: int
    free_memory_gib: int
    free_gpus: int
    price_per_vcpu_hour: float


class FloorInstance(BaseModel):
    instance_id: str
    hall: str
    pool_id: str
    state: InstanceState
    provider_id: str | None = None
    acquisition_id: str = ""


class FloorSnapshot(BaseModel):
    region: str
    contract: str
    bundle_serial: int | None = None
    problem: str = ""  # why the floor cannot be planned (no bundle, not tier 1, ...)
    tier: int = 1
    floor_units: int = 0
    halls: list[str] = []  # placement halls of the region with committed capacity
    shapes: list[FloorShape] = []
    committed: dict[str, HallCapacity] = {}
    # The floor's live instances: REQUESTED/ACTIVE, and NOTICED/DRAINING ones (reclaimed
    # anyway: they hold a reservation slot, not the floor).
    instances: list[FloorInstance] = []
    reservations: list[Reservation] = []  # the floor's reservations


class ProbeInput(BaseModel):
    region: str
    contract: str
    pools: dict[str, str] = {}  # hall -> a pool of the floor's shape there


class HallProbe(BaseModel):
    instances: int = 0  # the floor's ACTIVE instances in the hall (fleet state)
    unhealthy: int = 0  # of those, ERROR or not found at the provider
    answering: bool = True  # the provider reports capacity of the floor's shape there


class ProbeResult(BaseModel):
    halls: dict[str, HallProbe] = {}
