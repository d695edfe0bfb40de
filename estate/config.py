"""What the simulated estate looks like: horizon, demand scale, the reclaim model, boot and
detection times, and the exclusion cycle's settings (the workflow's defaults)."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planning.exclusion_cycle import CycleRules
from planning.hall_probe import ProbeRules
from planning.models import LoadRisk


class EstateConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    days: float = Field(default=30.0, gt=0, le=366)
    seed: int = 1
    regions: tuple[str, ...] = ()
    """Region ids to simulate; empty: every region given."""
    tenants: int = Field(default=2, ge=1, le=20)
    """Copies of each contract per region (tenants with the same contract shape)."""
    tick_minutes: int = Field(default=5, ge=1, le=60)
    """The controller plans every tick, and at once in a minute with reclaim notices."""

    # Reclaims: per-pool base rate, correlated bursts, bad pools, hall losses. The defaults
    # are the calibrated generator (published bands: contrast <= 10x, rates drifting over
    # the period, rankings that persist only partly, co-reclaims within 3 minutes across
    # pools, prices that differ by hall); `planted()` is the generator before issue 34.
    base_rate: float = Field(default=0.0005, ge=0)
    """Median reclaims per instance-hour of a good pool (log-normal spread over pools)."""
    rate_clip: float = Field(default=2.0, ge=1.0)
    """A good pool's rate stays within [base / clip, base * clip]."""
    bad_pools_per_region: int = Field(default=3, ge=0)
    bad_rate: float = Field(default=0.0025, ge=0)
    """Reclaims per instance-hour of a bad pool: 5x the median good pool, 10x the slowest."""
    bad_pools_among: Literal["all", "cheapest-third"] = "all"
    """Where the bad pools are drawn: among every pool a contract can use, or only among
    each region's cheapest third (the planted scenario)."""
    bad_redraw_days: float = Field(default=10.0, ge=0)
    """Every this many days half of the bad pools move elsewhere (0: never)."""
    rate_drift: float = Field(default=0.5, ge=0, lt=2)
    """Rates rise linearly over the horizon, from (1 - drift/2) to (1 + drift/2) times."""
    bursts_per_pool_day: float = Field(default=0.1, ge=0)
    bad_bursts_per_pool_day: float = Field(default=0.3, ge=0)
    burst_share: tuple[float, float] = (0.02, 0.06)
    """Share of a good pool's capacity one burst takes back (uniform in this range)."""
    bad_burst_share: tuple[float, float] = (0.04, 0.12)
    region_bursts_per_day: float = Field(default=0.5, ge=0)
    """Correlated bursts across one hall's pools (or one SKU's in every hall), all within
    ``burst_spread_minutes``."""
    owner_preempts: bool = True
    """The owner's own load takes back capacity: when its rise leaves fewer slots than ours
    the difference is reclaimed (False: it only limits new launches)."""
    hall_price_spread: float = Field(default=0.15, ge=0, lt=1)
    """Each hall's prices are list price times U[1 - spread, 1 + spread]."""
    pool_price_spread: float = Field(default=0.05, ge=0, lt=1)
    price_walk_per_day: float = Field(default=0.03, ge=0, lt=1)
    """Daily log-normal step of every pool's price (0: prices never change)."""
    burst_spread_minutes: int = Field(default=3, ge=1)
    """The co-reclaims of one burst fall within this many minutes."""
    reclaim_hold_minutes: int = Field(default=30, ge=0)
    """Capacity the provider took back stays with it this long."""
    hall_losses_per_region: int = Field(default=0, ge=0)
    """A fixed number of hall losses per region, each ``hall_loss_minutes`` long (the
    planted scenario: one)."""
    hall_loss_minutes: int = Field(default=180, ge=1)
    hall_losses_per_month: float = Field(default=4.0, ge=0)
    """Hall-loss events per region and 30 days (Poisson; the calibrated generator), each
    lasting ``hall_loss_span`` minutes (log-uniform)."""
    hall_loss_span: tuple[int, int] = (20, 240)
    hall_loss_overlap: float = Field(default=0.4, ge=0, le=1)
    """Chance an event takes a second hall down too, starting within the first's first
    hour (the two losses overlap)."""

    # The environment the floor keeper's probes see (not SCO's parameters).
    probe_glitches_per_hall_day: float = Field(default=0.05, ge=0)
    """Provider API glitches per hall and day: for 10-90 s the provider answers ERROR for
    each floor instance there with chance 0.7 and reports no capacity (false alarms)."""
    probe_stale: float = Field(default=0.25, ge=0, lt=1)
    """Chance a probe still reads a gone instance ACTIVE (a stale provider answer: misses
    and late detection)."""
    probe_lost: float = Field(default=0.02, ge=0, lt=1)
    """Chance a probe gets no answer at all (the activity fails: no verdict)."""

    # Fair comparison.
    warm_start: bool = True
    """Every policy's minute-0 capacity is up at minute 0 (False: it boots like any other)."""
    committed_markup: float = Field(default=2.5, ge=0)
    """A committed instance costs at least this many times its shape's spot list price
    (on-demand against spot); 0: the region's per-vCPU committed rate only."""
    baseline_fallback: bool = True
    """The peers fall back to committed capacity within the same spend authority as SCO."""
    partial_fallback: bool = True
    """A fallback over authority launches what fits (False: declines whole, as the product
    does while no operator approves)."""

    # Times.
    boot_minutes: int = Field(default=3, ge=1)
    committed_boot_minutes: int = Field(default=6, ge=1)
    floor_detect_minutes: int = Field(default=3, ge=1)
    """The legacy bound on a hall loss's detection, for the "explained" floor gaps only:
    the keeper detects losses through its probes (estate.halls)."""
    # The floor keeper's probe rule (workflows.floor.models.FloorConfig's defaults).
    floor_probe_seconds: int = Field(default=15, ge=1, le=60)
    floor_lost_fraction: float = Field(default=0.5, gt=0, le=1)
    floor_lost_probes: int = Field(default=2, ge=1)
    floor_clean_probes: int = Field(default=3, ge=1)

    # Work in flight, for work lost per reclaim.
    ci_job_minutes: float = Field(default=20.0, gt=0)
    spark_task_minutes: float = Field(default=6.0, gt=0)
    checkpoint_every_minutes: float = Field(default=60.0, gt=0)
    checkpoint_seconds: float = Field(default=45.0, gt=0)
    step_seconds: float = Field(default=2.0, gt=0)

    # SCO's reclaim-rate estimate (the ledger's window) and exclusion cycle (workflow defaults).
    rate_window_days: int = Field(default=7, ge=1)
    load_risk_rate: float = Field(default=2.0, ge=0)
    """The planner's owner-load risk (planning.models.LoadRisk): reclaims per instance-hour
    expected of a pool with nothing free (the controller's load_risk_rate)."""
    load_risk_free_share: float = Field(default=0.25, gt=0, le=1)
    """... none at or above this free share."""
    exclusion_window_minutes: int = Field(default=60, ge=1)
    exclusion_threshold: int = Field(default=3, ge=1)
    burst_merge_minutes: int = Field(default=3, ge=0)
    """Co-reclaims within this many minutes of a burst's first are one event (the workflow's
    burst_merge_seconds)."""
    base_cooldown_minutes: int = Field(default=15, ge=1)
    max_cooldown_minutes: int = Field(default=1440, ge=1)
    cooldown_jitter: float = Field(default=0.2, ge=0, lt=1)
    probe_minutes: int = Field(default=10, ge=1)
    strike_reset_minutes: int = Field(default=1440, ge=1)

    # Peers.
    karpenter_unavailable_minutes: int = Field(default=3, ge=1)
    skypilot_block_minutes: int = Field(default=60, ge=1)

    @property
    def minutes(self) -> int:
        return round(self.days * 1440)

    def probe_rules(self) -> ProbeRules:
        """The floor keeper's hall-loss rule, for the product's own verdict."""
        return ProbeRules(
            lost_fraction=self.floor_lost_fraction,
            lost_probes=self.floor_lost_probes,
            clean_probes=self.floor_clean_probes,
        )

    def load_risk(self) -> LoadRisk:
        """The planner's owner-load risk, as the controller gives it."""
        return LoadRisk(full_rate=self.load_risk_rate, free_share=self.load_risk_free_share)

    def exclusion_rules(self) -> CycleRules:
        """The exclusion cycle's settings, for the product's own state machine."""
        return CycleRules(
            window=timedelta(minutes=self.exclusion_window_minutes),
            threshold=self.exclusion_threshold,
            burst_merge=timedelta(minutes=self.burst_merge_minutes),
            base_cooldown=timedelta(minutes=self.base_cooldown_minutes),
            max_cooldown=timedelta(minutes=self.max_cooldown_minutes),
            jitter=self.cooldown_jitter,
            probe=timedelta(minutes=self.probe_minutes),
            strike_reset=timedelta(minutes=self.strike_reset_minutes),
        )


#: The generator and comparison before issue 34: bad pools at 100x in the cheapest third,
#: stationary rates, no cross-pool bursts, equal prices across halls, a cold start for the
#: peers, committed capacity at the per-vCPU rate and no fallback for the peers.
PLANTED: dict[str, object] = {
    "rate_clip": 1e9,
    "bad_rate": 0.05,
    "bad_pools_among": "cheapest-third",
    "bad_redraw_days": 0.0,
    "rate_drift": 0.0,
    "bad_bursts_per_pool_day": 1.0,
    "bad_burst_share": (0.1, 0.3),
    "region_bursts_per_day": 0.0,
    "owner_preempts": False,
    "hall_price_spread": 0.0,
    "pool_price_spread": 0.0,
    "price_walk_per_day": 0.0,
    "hall_losses_per_region": 1,
    "hall_losses_per_month": 0.0,
    "probe_glitches_per_hall_day": 0.0,
    "probe_stale": 0.0,
    "probe_lost": 0.0,
    "warm_start": False,
    "committed_markup": 0.0,
    "baseline_fallback": False,
    "partial_fallback": False,
}


def planted(**changes: object) -> EstateConfig:
    """The planted scenario (see PLANTED), with ``changes`` on top."""
    return EstateConfig.model_validate({**PLANTED, **changes})


def small_config(seed: int = 1) -> EstateConfig:
    """Two days of one region in the planted scenario: what the suite's golden figures
    were measured on."""
    return planted(days=2, seed=seed, regions=("r1",), tenants=1, tick_minutes=10)
