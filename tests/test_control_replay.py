"""Replay of recorded control-plane histories: a non-deterministic change fails here."""

from __future__ import annotations

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests import histories
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.budget.workflow import TokenBudgetWorkflow
from workflows.controller.workflow import RegionControllerWorkflow

RECORDED = ["acquisition_approved", "acquisition_cancelled", "region_controller"]


@pytest.mark.parametrize("name", RECORDED)
async def test_recorded_history_replays(name: str) -> None:
    replayer = Replayer(
        workflows=[AcquisitionWorkflow, RegionControllerWorkflow, TokenBudgetWorkflow],
        data_converter=pydantic_data_converter,
    )
    await replayer.replay_workflow(histories.load(name))
