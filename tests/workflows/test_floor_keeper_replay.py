"""The floor keepers' histories from issue 37's chaos run, replayed with today's code.

`floor-r1-search-api` replays clean. `floor-r1-llm-train` cannot, by nature: at event 3557
it holds a timer that a worker restarted after a kill started on a clock that had not moved
(the 6.932029 s left of timer 269, computed from the task at 16:52:03.348 again), while its
run predates the `floor-wakeups-from-timers` patch and so replays under the clock loop that
made it, and that loop, on the task's recorded time (16:52:20.305), decides a round's
activity. The command in history came from a clock no replay can see. Everything before
that task replays clean: `sco floor reset` (to the last task before it) is the remedy, and
a run started since the patch decides from which timer fired, not from the clock."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from tests.support.paths import DATA
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.floor.workflow import FloorKeeperWorkflow

WEDGED = ("floor-keeper-nondeterminism-after-worker-kill", "floor-r1-llm-train")
CLEAN = ("floor-keeper-same-run-replays-clean", "floor-r1-search-api")
#: The first event of the task that the restarted worker completed with the stale timer.
FIRST_BAD_TASK = 3552


def _history(name: str) -> dict[str, Any]:
    raw = gzip.decompress((DATA / "histories" / f"{name}.json.gz").read_bytes())
    loaded: dict[str, Any] = json.loads(raw)
    return loaded


def _replayer() -> Replayer:
    return Replayer(
        workflows=[FloorKeeperWorkflow, AcquisitionWorkflow], data_converter=pydantic_data_converter
    )


async def _replay(workflow_id: str, history: dict[str, Any]) -> None:
    await _replayer().replay_workflow(WorkflowHistory.from_json(workflow_id, json.dumps(history)))


async def test_the_search_api_keeper_of_the_same_run_replays_clean() -> None:
    name, workflow_id = CLEAN
    await _replay(workflow_id, _history(name))


async def test_the_wedged_keeper_fails_at_the_stale_timer_and_replays_clean_before_it() -> None:
    name, workflow_id = WEDGED
    history = _history(name)
    with pytest.raises(NondeterminismError, match="HistoryEvent\\(id: 3557, TimerStarted\\)"):
        await _replay(workflow_id, history)
    cut = {
        **history,
        "events": [e for e in history["events"] if int(e["eventId"]) < FIRST_BAD_TASK],
    }
    await _replay(workflow_id, cut)
