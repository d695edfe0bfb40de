"""Replay of recorded control-plane histories: a non-deterministic change fails here."""

from __future__ import annotations

import json

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.support import histories
from workflows.acquisition.workflow import PATCH_POOLED_TOKENS, AcquisitionWorkflow
from workflows.budget.client import PATCH_SIGNAL_FIRST
from workflows.budget.workflow import TokenBudgetWorkflow
from workflows.controller.workflow import RegionControllerWorkflow
from workflows.intake.workflow import DemandIntakeWorkflow
from workflows.slurm.workflow import SlurmReleaseWorkflow

RECORDED = [
    "acquisition_approved",
    "acquisition_cancelled",
    "acquisition_compensated",  # failed on its state writes: deletes what it created
    "acquisition_paused",  # from before pause/resume decisions: replays under the patch
    "acquisition_cancelled_at_once",  # deletes at once, a create in flight as it lands
    "acquisition_failed_answers_pause",  # fails with a pause in flight: answers it first
    "region_controller",
    "region_controller_headroom",  # targets demand + headroom under the headroom patch
    "slurm_acquisition",
    "slurm_release",
    "demand_intake",
]


#: Every recorded history of every scenario: a re-recording adds a file, the older ones
#: (the paths workflows started before a patch still take) keep replaying.
HISTORIES = [stem for name in RECORDED for stem in histories.recorded(name)]


def test_every_scenario_has_a_recorded_history() -> None:
    assert [name for name in RECORDED if not histories.recorded(name)] == []


@pytest.mark.parametrize("name", HISTORIES)
async def test_recorded_history_replays(name: str) -> None:
    replayer = Replayer(
        workflows=[
            AcquisitionWorkflow,
            RegionControllerWorkflow,
            TokenBudgetWorkflow,
            SlurmReleaseWorkflow,
            DemandIntakeWorkflow,
        ],
        data_converter=pydantic_data_converter,
    )
    await replayer.replay_workflow(histories.load(name))


def _markers(stem: str) -> list[str]:
    return [
        e.marker_recorded_event_attributes.marker_name
        for e in histories.load(stem).events
        if e.HasField("marker_recorded_event_attributes")
    ]


async def test_controller_histories_from_before_planning_left_the_workflow_task_replay() -> None:
    """Controllers that began before the plan-off-thread patch planned in their workflow
    tasks (no local-activity marker): they keep replaying on today's code, as does one
    recorded after it, whose ticks plan in the control.greedy_plan local activity."""
    stems = histories.recorded("region_controller")
    before = [s for s in stems if "core_local_activity" not in _markers(s)]
    after = [s for s in stems if "core_local_activity" in _markers(s)]
    # The first recording predates every patch; a later one has exact-plan but plans in
    # the workflow task; the newest plans in the local activity.
    assert "region_controller" in before
    assert any("core_patch" in _markers(s) for s in before), "no exact-plan-era history"
    assert after, "no history recorded since planning left the workflow task"
    replayer = Replayer(
        workflows=[RegionControllerWorkflow], data_converter=pydantic_data_converter
    )
    for stem in before + after:
        result = await replayer.replay_workflow(histories.load(stem), raise_on_replay_failure=False)
        assert result.replay_failure is None, f"{stem}: {result.replay_failure}"


def _patch_ids(stem: str) -> set[str]:
    """The `workflow.patched` ids a recorded history carries (its core_patch markers)."""
    ids = set()
    for e in histories.load(stem).events:
        if e.marker_recorded_event_attributes.marker_name != "core_patch":
            continue
        for payloads in e.marker_recorded_event_attributes.details.values():
            for p in payloads.payloads:
                ids.add(json.loads(p.data)["id"])
    return ids


@pytest.mark.parametrize(
    ("patch", "prefix"),
    [
        # Acquisitions that began before their slots pooled their create tokens took one
        # token per request (workflows/budget/pooled.py).
        (PATCH_POOLED_TOKENS, "acquisition_"),
        # Requesters that began before a budget request went out first ensured the budget
        # with an activity (workflows/budget/client.py): the acquisitions and controllers.
        (PATCH_SIGNAL_FIRST, "acquisition_"),
        (PATCH_SIGNAL_FIRST, "region_controller"),
    ],
)
async def test_histories_from_before_a_budget_patch_replay(patch: str, prefix: str) -> None:
    """Recorded before the patch and after it (decision 0042): both replay on today's code."""
    stems = [s for name in RECORDED if name.startswith(prefix) for s in histories.recorded(name)]
    before = [s for s in stems if patch not in _patch_ids(s)]
    after = [s for s in stems if patch in _patch_ids(s)]
    assert before and after, (before, after)
    replayer = Replayer(
        workflows=[AcquisitionWorkflow, RegionControllerWorkflow, TokenBudgetWorkflow],
        data_converter=pydantic_data_converter,
    )
    for stem in before + after:
        result = await replayer.replay_workflow(histories.load(stem), raise_on_replay_failure=False)
        assert result.replay_failure is None, f"{stem}: {result.replay_failure}"
