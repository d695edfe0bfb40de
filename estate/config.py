"""What the simulated estate looks like: horizon, demand scale, the reclaim model, boot and
detection times, and the exclusion cycle's settings (the workflow's defaults)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field

from planning.exclusion_cycle import CycleRules


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

    # Reclaims: per-pool base rate, correlated bursts, bad pools, hall losses.
    base_rate: float = Field(default=0.0005, ge=0)
    """Median reclaims per instance-hour of a good pool (log-normal spread over pools)."""
    bad_pools_per_region: int = Field(default=3, ge=0)
    bad_rate: float = Field(default=0.05, ge=0)
    """Reclaims per instance-hour of a bad pool."""
    bursts_per_pool_day: float = Field(default=0.1, ge=0)
    bad_bursts_per_pool_day: float = Field(default=1.0, ge=0)
    burst_share: tuple[float, float] = (0.02, 0.06)
    """Share of a good pool's capacity one burst takes back (uniform in this range)."""
    bad_burst_share: tuple[float, float] = (0.1, 0.3)
    burst_spread_minutes: int = Field(default=3, ge=1)
    """The co-reclaims of one burst fall within this many minutes."""
    reclaim_hold_minutes: int = Field(default=30, ge=0)
    """Capacity the provider took back stays with it this long."""
    hall_losses_per_region: int = Field(default=1, ge=0)
    hall_loss_minutes: int = Field(default=180, ge=1)

    # Times.
    boot_minutes: int = Field(default=3, ge=1)
    committed_boot_minutes: int = Field(default=6, ge=1)
    floor_detect_minutes: int = Field(default=3, ge=1)
    """Hall loss to the floor keeper's verdict (consecutive failed probes)."""

    # Work in flight, for work lost per reclaim.
    ci_job_minutes: float = Field(default=20.0, gt=0)
    spark_task_minutes: float = Field(default=6.0, gt=0)
    checkpoint_every_minutes: float = Field(default=60.0, gt=0)
    checkpoint_seconds: float = Field(default=45.0, gt=0)
    step_seconds: float = Field(default=2.0, gt=0)

    # SCO's reclaim-rate estimate (the ledger's window) and exclusion cycle (workflow defaults).
    rate_window_days: int = Field(default=7, ge=1)
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


def small_config(seed: int = 1) -> EstateConfig:
    """Two days of one region: what the test suite runs in seconds."""
    return EstateConfig(days=2, seed=seed, regions=("r1",), tenants=1, tick_minutes=10)
