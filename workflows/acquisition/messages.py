"""The acquisition's states, handler names and the messages its clients exchange with it:
what `sco acquisitions list | show | pause | ...` need, without the workflow's input (whose
fallback plan is the planner's model: `sco acquisitions list` imports no planning code).
`workflows.acquisition.models` re-exports all of it.

New fields always get defaults, so histories recorded before them still decode.
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, Field


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
