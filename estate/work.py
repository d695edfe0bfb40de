"""Work lost when an instance is taken back, by workload kind, in instance-minutes.

With notice (the region's lead) the node agent drains per contract: a CI job is requeued
and loses its progress; a Spark executor decommissions (blocks migrate), losing only the
tasks that cannot finish within the lead; training checkpoints on the notice when the
checkpoint fits the lead (else falls back to its last periodic checkpoint); a service
replica is rescheduled and loses nothing. Without notice (a hall loss) every kind loses
what it had since its last save. ``draw`` in [0, 1) says how far along the work was.
"""

from __future__ import annotations

from contracts.model import WorkloadKind
from estate.config import EstateConfig


def lost_minutes(
    kind: WorkloadKind,
    draw: float,
    cfg: EstateConfig,
    *,
    lead_seconds: float,
    notice: bool = True,
    checkpoint_on_notice: bool = True,
) -> float:
    if kind is WorkloadKind.CI:
        return draw * cfg.ci_job_minutes
    if kind is WorkloadKind.SPARK:
        elapsed = draw * cfg.spark_task_minutes
        remaining = cfg.spark_task_minutes - elapsed
        return 0.0 if notice and remaining * 60.0 <= lead_seconds else elapsed
    if kind is WorkloadKind.TRAINING:
        if notice and checkpoint_on_notice and cfg.checkpoint_seconds <= lead_seconds:
            return 0.0
        return draw * cfg.checkpoint_every_minutes
    return 0.0


def steps(minutes: float, cfg: EstateConfig) -> float:
    """Training steps in ``minutes`` of work."""
    return minutes * 60.0 / cfg.step_seconds
