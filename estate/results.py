"""What one run measures, per policy and region and summed over the estate (JSON-ready)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class KindLoss(BaseModel):
    reclaims: int = 0
    lost_minutes: float = 0.0
    """Instance-minutes of work lost, draining per contract on the notice (SCO's agent:
    training checkpoints on the notice)."""
    lost_minutes_periodic: float = 0.0
    """The same reclaims with periodic checkpoints only (no checkpoint on notice)."""
    hall_lost: int = 0  # instances gone in a hall loss, without notice
    hall_lost_minutes: float = 0.0


class Gap(BaseModel):
    start: int  # minute
    end: int
    explained: bool  # inside a hall loss's rebuild window (detection + boot)
    why: str


class FloorResult(BaseModel):
    region: str
    contract: str
    floor_units: int
    minutes: int
    whole_minutes: int
    gaps: list[Gap] = []

    @property
    def availability(self) -> float:
        return self.whole_minutes / self.minutes if self.minutes else 1.0


class FallbackResult(BaseModel):
    region: str
    contract: str
    authority_per_hour: float
    max_spend_per_hour: float
    minutes_over: int
    launched: int
    declined: int
    refused_units: int = 0  # units over authority left unserved (no operator approves)
    reasons: list[str] = []


class ExclusionResult(BaseModel):
    bad_pools: list[str]
    excluded_pools: list[str]
    bad_excluded: list[str]
    good_excluded: list[str]
    exposed_good_pools: int  # good pools SCO ever held instances in
    probes: int
    excluded_minutes: dict[str, int]  # per excluded pool
    timelines: dict[str, list[tuple[int, str]]]  # bad pools: (minute, state)


class HallDetection(BaseModel):
    """A floor keeper's probe verdict (estate.halls): a hall judged lost or back."""

    contract: str
    hall: str
    minute: int
    lost: bool  # True: judged lost; False: judged back
    true_loss: bool  # the hall was in fact down at that minute


class RegionRun(BaseModel):
    policy: str
    region: str
    cost: float
    cost_reclaimable: float
    cost_committed: dict[str, float]
    reclaimable_instance_hours: float
    reclaims: int
    short_unit_hours: float  # demand no capacity was launched for, sampled on ticks
    loss: dict[str, KindLoss]
    floors: list[FloorResult]
    fallback: list[FallbackResult] = []
    pool_reclaims: dict[str, int]
    hourly_cost: list[float]  # cumulative, at the end of each hour
    exclusion: ExclusionResult | None = None
    floor_trace: dict[str, list[tuple[int, int]]] = {}  # hall -> (minute, floor units)
    floor_trace_contract: str = ""
    hall_detections: list[HallDetection] = []
    # One set of measures for every policy (issue 34), from ready capacity.
    served_unit_hours: float = 0.0  # min(demand, units up), sampled on ticks
    unserved_unit_hours: float = 0.0
    lost_unit_hours: float = 0.0  # work lost, reclaims and hall losses, in unit-hours
    below_floor_minutes: int = 0  # tier-1 minutes with all serving capacity below floor
    capacity_waits: list[int] = Field(default_factory=list, exclude=True)
    """Minutes each shortfall lasted (demand above units up, until covered)."""
    voluntary_releases: int = 0  # reclaimable instances the policy let go itself
    acquisitions: int = 0  # a contract's launches in one minute (one acquisition workflow)
    instances_launched: int = 0
    # The lifecycle comparison's own measures (estate/lifecycle_sim.py), by name.
    lifecycle: dict[str, float] = {}


class PolicySummary(BaseModel):
    policy: str
    cost: float
    reclaimable_instance_hours: float
    reclaims: int
    reclaims_per_1000h: float
    short_unit_hours: float
    lost_minutes_per_reclaim: dict[str, float]  # by kind, draining on the notice
    training_steps_per_reclaim: float  # checkpoint on the notice
    training_steps_per_reclaim_periodic: float  # periodic checkpoints only
    floor_availability: float  # minutes whole / minutes, over every tier-1 floor
    floor_gap_minutes: int
    floor_unexplained_gap_minutes: int
    fallback_minutes_over: int
    fallback_max_share_of_authority: float
    wrongly_excluded_share: float | None = None  # good pools excluded / exposed good pools
    good_excluded_time_share: float | None = None  # of all excluded pool-minutes
    # One set of measures for every policy (issue 34).
    served_unit_hours: float = 0.0
    unserved_unit_hours: float = 0.0
    cost_per_served_unit_hour: float = 0.0
    p99_time_to_capacity_minutes: float = 0.0
    work_lost_per_1000_unit_hours: float = 0.0
    below_floor_minutes: int = 0
    fallback_refused_units: int = 0
    voluntary_releases: int = 0
    # The control plane's work over the run (issue 33): acquisitions, instances launched.
    acquisitions: int = 0
    instances_launched: int = 0


class EstateResult(BaseModel):
    days: float
    seed: int
    regions: list[str]
    tenants: int
    pools: int
    bad_pools: dict[str, list[str]]
    hall_losses: dict[str, list[tuple[str, int, int]]]
    policies: list[PolicySummary]
    runs: list[RegionRun]
