"""What the pool exclusion cycle's activities take and return, and the pool states they store."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from activities.events import InstanceState

# Re-exported: the cycle's states (planning.exclusion_cycle) are what its rows store.
from planning.exclusion_cycle import PoolState as PoolState


class SetStateInput(BaseModel):
    pool_id: str
    state: PoolState
    reason: str = ""
    strikes: int = 0
    excluded_until: datetime | None = None
    set_by: str = "cycle"


class PoolRef(BaseModel):
    pool_id: str


class ExclusionRow(BaseModel):
    pool_id: str
    state: PoolState
    reason: str
    strikes: int
    excluded_until: datetime | None
    set_by: str
    updated_at: datetime


class LoadStateOutput(BaseModel):
    row: ExclusionRow | None = None


class CountNoticesInput(BaseModel):
    region: str
    pool_id: str
    window_seconds: float


class NoticeSeen(BaseModel):
    instance_id: str
    age_seconds: float
    """By the database's clock: the workflow stamps it `workflow.now() - age`, so the two
    clocks never need to agree."""


class CountNoticesOutput(BaseModel):
    notices: list[NoticeSeen] = []


class Canary(BaseModel):
    instance_id: str
    provider_id: str | None = None
    state: InstanceState


class CanariesOutput(BaseModel):
    canaries: list[Canary] = []


#: The contract name canaries run under (fleet state, ledger).
CANARY_WORKLOAD = "sco-canary"
