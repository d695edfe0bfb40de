"""Inputs, outputs and messages of the lifecycle workflow.

New fields always get defaults, so histories recorded before them still decode.
"""

from __future__ import annotations

import enum
from datetime import datetime

from pydantic import BaseModel, Field

#: Handler names, used by the workflow's decorators and by every client. Running
#: workflows answer to these strings: never rename one.
PAUSE_SIGNAL = "pause"
RESUME_SIGNAL = "resume"
STATUS_QUERY = "status"

#: Replacements kept in the status query's `recent`.
RECENT = 20


class LifecycleConfig(BaseModel):
    # Seconds between rounds (a pause or resume starts one at once).
    interval_seconds: float = Field(default=300.0, gt=0)
    # Anti-churn for return from fallback (planning/lifecycle.py).
    min_age_seconds: float = Field(default=3600.0, ge=0)
    stable_rounds: int = Field(default=2, ge=1)
    min_saving_per_hour: float = Field(default=0.0, ge=0)
    # Consolidation: on or off, and its least saving as a share of the replaced cost.
    consolidate: bool = True
    consolidation_margin: float = Field(default=0.2, ge=0, le=1)
    # ... and the same consolidation found on this many rounds in a row (decision 0039).
    consolidation_stable_rounds: int = Field(default=12, ge=1)
    # Return from fallback: at most this many smaller reclaimable instances replace one
    # fallback instance when none as large is free (1: one for one only).
    max_return_parts: int = Field(default=4, ge=1)
    # The replacement's acquisition: ACTIVE polls, and how long a boot may stay in BUILD.
    poll_seconds: float = Field(default=1.0, gt=0)
    build_timeout_seconds: float = Field(default=900.0, gt=0)
    # Attempts at telling the hall's notice relay (NATS away, relay restarting); after
    # they fail, the hall's instances wait this long before a replacement is tried again.
    drain_attempts: int = Field(default=5, ge=1)
    drain_retry_seconds: float = Field(default=1800.0, ge=0)
    # Rounds per run, or history events, before continue-as-new.
    rounds_per_run: int = Field(default=200, ge=1)
    max_history_events: int = Field(default=2000, ge=100)


class LifecycleState(enum.StrEnum):
    WATCHING = "watching"  # nothing to replace, or every candidate held back
    REPLACING = "replacing"  # replacements under way, make-before-break
    PAUSED = "paused"  # an operator paused the region: no round plans anything


class PauseInput(BaseModel):
    # "": the whole region; else one contract.
    contract: str = ""
    operator: str = Field(default="operator", min_length=1)
    reason: str = ""
    # The operator's authenticated identity (client-certificate subject), "" without one.
    identity: str = ""


class ReplacementRecord(BaseModel):
    contract: str
    instance_id: str
    reason: str
    outcome: str  # replaced | held | failed
    why: str
    at: datetime
    replacement: str = ""  # the new instance's id
    saving_per_hour: float = 0.0


class LifecycleInput(BaseModel):
    region: str
    config: LifecycleConfig = LifecycleConfig()
    # Carried over continue-as-new.
    paused: bool = False
    paused_contracts: list[str] = []
    free_streak: dict[str, int] = {}
    consolidation_streak: dict[str, int] = {}
    undrainable: dict[str, datetime] = {}  # hall -> until when its drains are not tried
    held: dict[str, str] = {}  # instance -> why it is held back (as last recorded)
    rounds: int = 0
    replaced: int = 0
    saved_per_hour: float = 0.0
    recent: list[ReplacementRecord] = []
    budget_counter: int = 0


class LifecycleStatus(BaseModel):
    region: str
    state: LifecycleState = LifecycleState.WATCHING
    paused: bool = False
    paused_contracts: list[str] = []
    rounds: int = 0
    replaced: int = 0
    # Sum of (old - new) price per hour over the replacements done: fallback spend stopped.
    saved_per_hour: float = 0.0
    in_flight: dict[str, str] = {}  # instance being replaced -> reason
    held: dict[str, str] = {}
    undrainable: dict[str, datetime] = {}
    recent: list[ReplacementRecord] = []
    reason: str = ""  # why the last round planned nothing (no bundle, ...)
    bundle_serial: int | None = None
    pending: bool = False  # a signal arrived that no round has acted on yet
