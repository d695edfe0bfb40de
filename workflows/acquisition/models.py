"""Inputs, outputs and messages of the acquisition workflow.

New fields always get defaults, so histories recorded before them still decode.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from activities.events import CapacityType
from planning.arbiter import FallbackPlan
from workflows.acquisition.messages import (
    APPROVE_FALLBACK_UPDATE,
    CANCEL_UPDATE,
    FINISHED,
    PAUSE_UPDATE,
    PROGRESS_QUERY,
    RESUME_UPDATE,
    AcquisitionProgress,
    AcquisitionState,
    ApprovalInput,
    ControlAck,
    FallbackState,
    OperatorInput,
)

# The messages live in workflows.acquisition.messages (no planning import for the CLI);
# every importer of this module finds them here too.
__all__ = [
    "APPROVE_FALLBACK_UPDATE",
    "CANCEL_UPDATE",
    "FINISHED",
    "PAUSE_UPDATE",
    "PROGRESS_QUERY",
    "RESUME_UPDATE",
    "AcquisitionInput",
    "AcquisitionProgress",
    "AcquisitionResult",
    "AcquisitionState",
    "ApprovalInput",
    "ControlAck",
    "FallbackState",
    "LaunchItem",
    "OperatorInput",
]


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


class AcquisitionResult(BaseModel):
    progress: AcquisitionProgress
    instance_ids: list[str] = []  # ACTIVE at the end
