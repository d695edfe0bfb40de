"""What the region controller reads each tick, and its messages."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

#: Handler names, used by the workflow's decorators and by every client. Running
#: workflows answer to these strings: never rename one.
DEMAND_CHANGED_SIGNAL = "demand_changed"
STATUS_QUERY = "status"


def controller_workflow_id(region: str, partition: int) -> str:
    return f"controller-{region}-p{partition}"


class ControllerConfig(BaseModel):
    tick_seconds: float = 60.0
    release_idle_seconds: float = 900.0
    approval_timeout_seconds: float = 1800.0
    fallback_lease_hours: float = 24.0
    build_timeout_seconds: float = 900.0
    spread_max_pool_fraction: float = 0.25
    max_instances_per_acquisition: int = 200
    reclaim_window_hours: float = 168.0
    # The planner's owner-load risk (planning.models.LoadRisk, made by the workflow: the
    # operator's CLI imports these models and never the planner): reclaims per instance-hour
    # expected of a pool with nothing free, none at or above the free share.
    load_risk_rate: float = 2.0
    load_risk_free_share: float = 0.25
    partitions: int = 4
    # Seconds the exact planner (HiGHS, an activity) may take on a tick with something to
    # plan; the greedy plan stands when it finds nothing better in time. 0: greedy only.
    exact_plan_seconds: float = 5.0
    # Seconds between ACTIVE polls of the acquisitions it starts (AcquisitionInput's
    # default); a time-compressed bench scales it with every other duration.
    acquisition_poll_seconds: float = 1.0
    # Ticks per run before continue-as-new keeps the history short.
    ticks_per_run: int = 30  # control.ticks_per_run (decision 0040)
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
    # Units held ready beyond demand as cover (contract headroom), and of those what
    # reclaimable capacity could not cover this tick.
    headroom_units: int = 0
    headroom_short_units: int = 0


class ControllerStatus(BaseModel):
    region: str
    partition: int
    ticks: int
    acquisitions_started: int
    released: int
    last: TickSummary | None = None
    pending_signal: bool = False
