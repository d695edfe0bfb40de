"""Inputs, status and messages of the demand intake workflow.

New fields always get defaults, so histories recorded before them still decode.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from activities.demand.intake import SourceReport

#: Handler names, used by the workflow's decorators and by every client. Running
#: workflows answer to these strings: never rename one.
COLLECT_NOW_SIGNAL = "collect_now"
STATUS_QUERY = "status"


def intake_workflow_id(region: str) -> str:
    """The region's one intake workflow."""
    return f"demand-intake-{region}"


class IntakeConfig(BaseModel):
    interval_seconds: float = Field(default=15.0, gt=0)
    partitions: int = Field(default=4, ge=1)
    # Rounds per run before continue-as-new keeps the history short.
    rounds_per_run: int = Field(default=500, ge=1)
    # A source unreadable this long has its demand dropped (until then it is kept).
    stale_after_seconds: float = Field(default=1800.0, gt=0)


class IntakeInput(BaseModel):
    region: str
    config: IntakeConfig = IntakeConfig()
    rounds: int = 0  # carried over continue-as-new
    failing_since: dict[str, datetime] = {}  # source -> first failed round, carried over


class CollectNow(BaseModel):
    requested_by: str = "operator"


class IntakeRound(BaseModel):
    round: int
    at: datetime
    bundle_serial: int | None = None
    problem: str = ""
    reports: list[SourceReport] = []
    changed: list[str] = []
    signalled: list[str] = []  # controller workflow ids woken
    not_running: list[str] = []  # controllers that could not be signalled


class IntakeStatus(BaseModel):
    region: str
    rounds: int
    last: IntakeRound | None = None
    failing_since: dict[str, datetime] = {}
