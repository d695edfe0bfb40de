"""What the region controller's activities take and return: its snapshot of contracts, demand,
instances and capacity, and the surplus marks. The controller workflow imports them from here."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from activities.control.partition import partition_of as partition_of  # re-exported
from activities.events import CapacityType, InstanceState
from planning.models import ContractDemand, LoadRisk, PoolInput

#: Acquisitions the controller started; floors and probes use their own prefixes.
ACQUISITION_PREFIX = "acq-"


class InstanceBrief(BaseModel):
    instance_id: str
    pool_id: str
    hall: str
    state: InstanceState
    capacity_type: CapacityType
    price_per_hour: float
    acquisition_id: str | None = None
    provider_id: str | None = None


class ContractView(BaseModel):
    """One contract of the partition as the controller sees it this tick."""

    demand: ContractDemand  # demand_units: raw demand; existing: live reclaimable instances
    tier: int
    authority_per_hour: float
    fallback_spend_per_hour: float = 0.0  # live committed fallback instances
    fallback_units: int = 0
    outstanding_units: int = 0  # asked of open acquisitions, not yet in fleet state
    awaiting_approval: bool = False
    fallback_declined_at: datetime | None = None
    instances: list[InstanceBrief] = []  # live instances SCO acquired (release candidates)
    kubernetes: bool = False  # has Kubernetes selectors: its instances join as nodes
    # Units to hold ready beyond demand now (contracts/headroom.py: headroom_units, or an
    # open headroom schedule's), and which setting asked for them.
    headroom_units: int = 0
    headroom_why: str = ""


class ControllerSnapshot(BaseModel):
    region: str
    partition: int
    bundle_serial: int | None = None
    problem: str = ""  # why the controller cannot plan (no bundle, ...); shown in status
    contracts: list[ContractView] = []
    pools: list[PoolInput] = []
    committed_rate: dict[str, float] = {}  # hall -> price per vCPU-hour


class SnapshotInput(BaseModel):
    region: str
    partition: int
    partitions: int
    reclaim_window_hours: float = 168.0
    # Off for inputs written before the owner-load risk (their ticks priced history only).
    load_risk: LoadRisk = LoadRisk()


class MarkSurplusInput(BaseModel):
    region: str
    workloads: list[str]
    instance_ids: list[str] = Field(default_factory=list)


class MarkSurplusOutput(BaseModel):
    since: dict[str, datetime] = {}
