"""What the region controller reads each tick, and its messages."""

from __future__ import annotations

import zlib
from datetime import datetime

from pydantic import BaseModel, Field

from activities.events import CapacityType, InstanceState
from workflows.planning.models import ContractDemand, PoolInput


def partition_of(contract: str, partitions: int) -> int:
    """The controller partition that owns a contract (stable across processes)."""
    return zlib.crc32(contract.encode()) % partitions


def controller_workflow_id(region: str, partition: int) -> str:
    return f"controller-{region}-p{partition}"


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


class ControllerConfig(BaseModel):
    tick_seconds: float = 60.0
    release_idle_seconds: float = 900.0
    approval_timeout_seconds: float = 1800.0
    fallback_lease_hours: float = 24.0
    spread_max_pool_fraction: float = 0.25
    max_instances_per_acquisition: int = 200
    reclaim_window_hours: float = 168.0
    partitions: int = 4
    # Ticks per run before continue-as-new keeps the history short.
    ticks_per_run: int = 200
    # Cloud-init for instances of contracts with Kubernetes selectors; `{kubelet_args}`
    # becomes the node's labels and taints. None: no user-data.
    kubernetes_user_data: str | None = None


class ControllerInput(BaseModel):
    region: str
    partition: int
    config: ControllerConfig = ControllerConfig()
    # Carried over continue-as-new.
    ticks: int = 0
    acquisitions_started: int = 0
    released: int = 0
    budget_counter: int = 0


class DemandChanged(BaseModel):
    contracts: list[str] = []
    source: str = "cli"


class TickSummary(BaseModel):
    tick: int
    at: datetime
    bundle_serial: int | None = None
    problem: str = ""
    demand_units: int = 0
    held_units: int = 0
    planned_units: int = 0
    shortfall_units: int = 0
    acquisitions: list[str] = []
    released: list[str] = []
    surplus: int = 0
    plan_cost_per_hour: float = 0.0


class ControllerStatus(BaseModel):
    region: str
    partition: int
    ticks: int
    acquisitions_started: int
    released: int
    last: TickSummary | None = None
    pending_signal: bool = False


class MarkSurplusInput(BaseModel):
    region: str
    workloads: list[str]
    instance_ids: list[str] = Field(default_factory=list)


class MarkSurplusOutput(BaseModel):
    since: dict[str, datetime] = {}
