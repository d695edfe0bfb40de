"""Inputs, outputs, messages and carried state of the pool exclusion workflow.

New fields always get defaults, so histories recorded before them still decode.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import AwareDatetime, BaseModel, Field

from activities.exclusion.models import PoolState
from contracts.pool_id import PoolId
from planning.exclusion_cycle import CycleRules

WORKFLOW_TYPE = "PoolExclusionWorkflow"
#: Handler names, used by the workflow's decorators and by every client. Running
#: workflows answer to these strings: never rename one.
RECLAIM_NOTICED_SIGNAL = "reclaim_noticed"
STATUS_QUERY = "status"
EXCLUDE_UPDATE = "exclude"
READMIT_UPDATE = "readmit"
#: Child ids of probes; the region controller counts only `acq-` acquisitions.
PROBE_PREFIX = "probe-"


def exclusion_workflow_id(pool_id: str) -> str:
    """The id of the pool's one exclusion workflow."""
    return f"pool-exclusion-{pool_id}"


def probe_budget_key(region: str) -> str:
    """The budget region key of the region's probes: budget id `token-budget-<region>-probes`."""
    return f"{region}-probes"


class ExclusionConfig(BaseModel):
    window_seconds: float = Field(default=3600.0, gt=0)
    """Sliding window over which reclaim notices are counted."""
    threshold: int = Field(default=3, ge=1)
    """Reclaim events within the window that exclude the pool."""
    burst_merge_seconds: float = Field(default=180.0, ge=0)
    """Notices this close after a burst's first count as that one event: a co-reclaim of a
    slice of the pool is one signal, not many (the estate simulation: docs/estate/)."""
    check_seconds: float = Field(default=300.0, gt=0)
    """Safety net: how often fleet state is asked for notices no signal brought."""
    base_cooldown_seconds: float = Field(default=900.0, gt=0)
    max_cooldown_seconds: float = Field(default=86400.0, gt=0)
    jitter: float = Field(default=0.2, ge=0, lt=1)
    probe_seconds: float = Field(default=600.0, gt=0)
    """How long a canary must stay ACTIVE and unnoticed for the pool to be re-admitted."""
    strike_reset_seconds: float = Field(default=86400.0, gt=0)
    """Strikes are forgiven once the pool has been admitted this long without exclusion."""
    probe_rate_per_second: float = Field(default=1 / 30, gt=0)
    """Canaries per second across the region (the probe budget, when this starts it)."""
    probe_burst: int = Field(default=1, ge=1)
    continue_after_events: int = Field(default=500, ge=2)
    """Signals and loop turns after which the workflow continues-as-new."""

    def cycle_rules(self) -> CycleRules:
        """The settings the cycle's state machine decides by (planning.exclusion_cycle)."""
        return CycleRules(
            window=timedelta(seconds=self.window_seconds),
            threshold=self.threshold,
            burst_merge=timedelta(seconds=self.burst_merge_seconds),
            base_cooldown=timedelta(seconds=self.base_cooldown_seconds),
            max_cooldown=timedelta(seconds=self.max_cooldown_seconds),
            jitter=self.jitter,
            probe=timedelta(seconds=self.probe_seconds),
            strike_reset=timedelta(seconds=self.strike_reset_seconds),
        )


class Transition(BaseModel):
    at: datetime
    from_state: PoolState
    to_state: PoolState
    strikes: int
    actor: str
    reason: str = ""


class ExclusionCarry(BaseModel):
    """Everything the cycle knows, carried over continue-as-new."""

    state: PoolState = PoolState.ADMITTED
    strikes: int = 0
    reason: str = ""
    set_by: str = "cycle"
    excluded_until: datetime | None = None
    """When the cool-down ends and the probe starts; None while excluded: until an operator
    re-admits the pool."""
    since: datetime | None = None
    admitted_since: datetime | None = None
    counted_since: datetime | None = None
    """Notices before this (the last re-admission) no longer count."""
    notices: dict[str, datetime] = {}
    """instance id -> notice time, within the window."""
    history: list[Transition] = []
    probes: int = 0
    budget_counter: int = 0
    adopted: bool = False
    """The exclusions row of an earlier workflow was read (once per workflow id)."""


class ExclusionInput(BaseModel):
    pool_id: str
    region: str
    hall: str
    flavor: str
    config: ExclusionConfig = ExclusionConfig()
    carry: ExclusionCarry | None = None


def exclusion_input(pool_id: str, config: ExclusionConfig | None = None) -> ExclusionInput:
    """The input of the pool's exclusion workflow; ValueError when it is not a pool id."""
    pid = PoolId.parse(pool_id)
    return ExclusionInput(
        pool_id=str(pid),
        region=pid.region,
        hall=pid.hall,
        flavor=pid.flavor,
        config=config or ExclusionConfig(),
    )


class ReclaimNoticed(BaseModel):
    instance_id: str = Field(min_length=1)
    at: AwareDatetime


class OperatorExclude(BaseModel):
    operator: str = Field(min_length=1)
    reason: str = Field(min_length=1)
    hours: float | None = Field(default=None, gt=0, le=24 * 365)
    """None: until an operator re-admits it; else probed (like a cycle exclusion) after."""
    # The operator's authenticated identity (client-certificate subject), "" without one.
    identity: str = ""


class OperatorReadmit(BaseModel):
    operator: str = Field(min_length=1)
    reason: str = Field(min_length=1)
    # The operator's authenticated identity (client-certificate subject), "" without one.
    identity: str = ""


class ExclusionAck(BaseModel):
    state: PoolState
    strikes: int
    excluded_until: datetime | None = None
    message: str = ""


class ExclusionStatus(BaseModel):
    pool_id: str
    region: str = ""
    state: PoolState
    strikes: int
    notices_in_window: int
    excluded_until: datetime | None = None
    set_by: str = ""
    reason: str = ""
    since: datetime | None = None
    probe_id: str = ""
    """The running canary acquisition, while probing."""
    probes: int = 0
    history: list[Transition] = []
