"""Inputs, outputs and messages of the acquisition workflow.

New fields always get defaults, so histories recorded before them still decode.
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, Field, model_validator

from activities.events import CapacityType
from planning.arbiter import FallbackPlan


class AcquisitionState(enum.StrEnum):
    STARTING = "starting"  # recorded by the controller, workflow not yet running
    RUNNING = "running"
    PAUSED = "paused"
    WAITING_APPROVAL = "waiting_approval"  # fallback above spend authority
    CANCELLING = "cancelling"  # deleting what it created
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    DECLINED = "declined"  # nothing launched: fallback declined and no reclaimable items
    FAILED = "failed"


#: The acquisition's handler names, shared by the workflow and its clients. Running
#: acquisitions answer to these strings: never rename one.
PROGRESS_QUERY = "progress"
PAUSE_UPDATE = "pause"
RESUME_UPDATE = "resume"
CANCEL_UPDATE = "cancel"
APPROVE_FALLBACK_UPDATE = "approve_fallback"


FINISHED = frozenset(
    {
        AcquisitionState.COMPLETED,
        AcquisitionState.CANCELLED,
        AcquisitionState.DECLINED,
        AcquisitionState.FAILED,
    }
)


class FallbackState(enum.StrEnum):
    NONE = "none"
    PROCEEDING = "proceeding"  # within spend authority
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    DECLINED = "declined"


class LaunchItem(BaseModel):
    """`instances` new instances in one pool, covering `units` demand units."""

    pool_id: str
    hall: str
    flavor: str
    instances: int = Field(ge=1)
    units: int = Field(ge=0)
    capacity_type: CapacityType = CapacityType.RECLAIMABLE
    price_per_hour: float | None = None  # committed price; None: the pool's own
    # Boot into this Blazar reservation (committed capacity the caller reserved, e.g. a
    # floor); None: reclaimable, or a fallback reservation the acquisition makes itself.
    reservation_id: str | None = None
    # One hostname per instance (Slurm CLOUD node names); empty: any names.
    hostnames: list[str] = []
    # Cloud-init user-data; `{hostname}` becomes the instance's hostname.
    user_data: str | None = None

    @model_validator(mode="after")
    def _one_hostname_per_instance(self) -> LaunchItem:
        if self.hostnames and len(self.hostnames) != self.instances:
            raise ValueError(
                f"hostnames: {len(self.hostnames)} given for {self.instances} instance(s)"
            )
        return self


class AcquisitionInput(BaseModel):
    region: str
    partition: int = 0
    contract: str
    tier: int = Field(ge=1, le=3)
    items: list[LaunchItem] = []
    fallback: FallbackPlan | None = None
    approval_timeout_seconds: float = 1800.0
    fallback_lease_hours: float = 24.0
    # Slots in flight at once; the region's token budget sets the actual pace.
    max_parallel: int = Field(default=20, ge=1)
    # Create attempts per instance on Transient/RateLimited errors (each takes a token).
    max_create_attempts: int = Field(default=5, ge=1)
    # Seconds between ACTIVE polls while waiting for a boot.
    poll_seconds: float = Field(default=1.0, gt=0)
    # A boot still in BUILD this long after its create (or a create that has not answered
    # for this long) is given up: deleted and counted as a shortfall. No slot waits forever.
    build_timeout_seconds: float = Field(default=900.0, gt=0)
    # Cloud-init for every instance without its own (a Kubernetes node join):
    # `{kubelet_args}` becomes the labels and taints naming its pool, hall, capacity type.
    kubelet_user_data: str | None = None


class OperatorInput(BaseModel):
    operator: str = Field(default="operator", min_length=1)
    reason: str = ""
    # The operator's authenticated identity (client-certificate subject), "" without one.
    identity: str = ""


class ApprovalInput(BaseModel):
    approver: str = Field(min_length=1)
    reason: str = Field(min_length=1)
    approve: bool = True  # False declines at once
    # The operator's authenticated identity (client-certificate subject), "" without one.
    identity: str = ""


class ControlAck(BaseModel):
    state: AcquisitionState
    message: str


class AcquisitionProgress(BaseModel):
    acquisition_id: str
    region: str
    contract: str
    state: AcquisitionState
    requested_instances: int
    requested_units: int
    launched: int = 0  # create calls that returned an instance
    active: int = 0
    failed: int = 0
    deleted: int = 0
    shortfall_units: int = 0
    capacity_errors: dict[str, int] = {}  # pool -> InsufficientCapacity count
    fallback: FallbackState = FallbackState.NONE
    fallback_cost_per_hour: float = 0.0
    fallback_reason: str = ""
    decided_by: str = ""
    decision_reason: str = ""
    paused_by: str = ""
    pools: list[str] = []
    halls: list[str] = []


class AcquisitionResult(BaseModel):
    progress: AcquisitionProgress
    instance_ids: list[str] = []  # ACTIVE at the end
