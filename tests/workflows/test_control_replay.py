"""Replay of recorded control-plane histories: a non-deterministic change fails here."""

from __future__ import annotations

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.support import histories
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.budget.workflow import TokenBudgetWorkflow
from workflows.controller.workflow import RegionControllerWorkflow
from workflows.intake.workflow import DemandIntakeWorkflow
from workflows.slurm.workflow import SlurmReleaseWorkflow

RECORDED = [
    "acquisition_approved",
    "acquisition_cancelled",
    "acquisition_compensated",  # failed on its state writes: deletes what it created
    "acquisition_paused",  # from before pause/resume decisions: replays under the patch
    "region_controller",
    "slurm_acquisition",
    "slurm_release",
    "demand_intake",
]


@pytest.mark.parametrize("name", RECORDED)
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
