"""Settings → the configs the region's long-lived workflows start with: the one place that
copies `Settings` fields into workflow inputs (the worker's starters, `sco reconcile`, and
any test or bench that wants the configured values use it)."""

from __future__ import annotations

from dataclasses import dataclass

from workers.settings import Settings
from workflows.controller.models import ControllerConfig
from workflows.intake.models import IntakeConfig
from workflows.lifecycle.models import LifecycleConfig
from workflows.reconciler.models import ReconcilerConfig


@dataclass(frozen=True)
class WorkflowConfigs:
    controller: ControllerConfig
    reconciler: ReconcilerConfig
    intake: IntakeConfig
    lifecycle: LifecycleConfig


def controller_config(settings: Settings) -> ControllerConfig:
    c = settings.control
    return ControllerConfig(
        tick_seconds=c.tick_seconds,
        ticks_per_run=c.ticks_per_run,
        release_idle_seconds=c.release_idle_seconds,
        approval_timeout_seconds=c.approval_timeout_seconds,
        fallback_lease_hours=c.fallback_lease_hours,
        build_timeout_seconds=c.build_timeout_seconds,
        spread_max_pool_fraction=c.spread_max_pool_fraction,
        max_instances_per_acquisition=c.max_instances_per_acquisition,
        reclaim_window_hours=c.reclaim_window_hours,
        load_risk_rate=c.load_risk_rate,
        load_risk_free_share=c.load_risk_free_share,
        partitions=c.partitions,
        kubernetes_user_data=settings.kubernetes.node_user_data or None,
    )


def reconciler_config(settings: Settings) -> ReconcilerConfig:
    c = settings.control
    return ReconcilerConfig(
        interval_seconds=c.reconcile_interval_seconds,
        grace_seconds=c.reconcile_grace_seconds,
        lease_hours=c.fallback_lease_hours,
    )


def intake_config(settings: Settings) -> IntakeConfig:
    return IntakeConfig(
        interval_seconds=settings.intake.interval_seconds,
        stale_after_seconds=settings.intake.stale_after_seconds,
        partitions=settings.control.partitions,
    )


def lifecycle_config(settings: Settings) -> LifecycleConfig:
    lc = settings.lifecycle
    return LifecycleConfig(
        interval_seconds=lc.interval_seconds,
        min_age_seconds=lc.min_age_seconds,
        stable_rounds=lc.stable_rounds,
        min_saving_per_hour=lc.min_saving_per_hour,
        consolidate=lc.consolidate,
        consolidation_margin=lc.consolidation_margin,
        consolidation_stable_rounds=lc.consolidation_stable_rounds,
        max_return_parts=lc.max_return_parts,
        drain_retry_seconds=lc.drain_retry_seconds,
        build_timeout_seconds=settings.control.build_timeout_seconds,
    )


def configs_from(settings: Settings) -> WorkflowConfigs:
    """Every workflow config the settings determine."""
    return WorkflowConfigs(
        controller=controller_config(settings),
        reconciler=reconciler_config(settings),
        intake=intake_config(settings),
        lifecycle=lifecycle_config(settings),
    )
