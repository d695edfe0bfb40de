"""The simulated exclusion cycle runs on the workflow's defaults: a default changed on one
side only would make the estate figures describe a cycle SCO does not run. (The cycle's
decisions are one state machine for both: planning.exclusion_cycle.)"""

from __future__ import annotations

from estate.config import EstateConfig
from planning.models import LoadRisk
from workflows.controller.models import ControllerConfig
from workflows.exclusion.models import ExclusionConfig


def test_the_simulated_cycle_uses_the_workflow_defaults() -> None:
    sim, wf = EstateConfig(), ExclusionConfig()
    assert sim.exclusion_window_minutes * 60 == wf.window_seconds
    assert sim.exclusion_threshold == wf.threshold
    assert sim.burst_merge_minutes * 60 == wf.burst_merge_seconds
    assert sim.base_cooldown_minutes * 60 == wf.base_cooldown_seconds
    assert sim.max_cooldown_minutes * 60 == wf.max_cooldown_seconds
    assert sim.cooldown_jitter == wf.jitter
    assert sim.probe_minutes * 60 == wf.probe_seconds
    assert sim.strike_reset_minutes * 60 == wf.strike_reset_seconds
    # What the state machine is given, field by field, whichever side builds it.
    assert sim.exclusion_rules() == wf.cycle_rules()


def test_the_simulated_planner_prices_load_as_the_controller_does() -> None:
    wf = ControllerConfig()
    assert EstateConfig().load_risk() == LoadRisk(
        full_rate=wf.load_risk_rate, free_share=wf.load_risk_free_share
    )
