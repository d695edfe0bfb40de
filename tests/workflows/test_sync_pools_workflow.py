"""SyncPoolsWorkflow on a real worker: Temporal's test server, real PostgreSQL; and replay
of a recorded history, which fails when a change to the workflow breaks determinism."""

from __future__ import annotations

import concurrent.futures
import json
import os
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from activities.fleet.activities import FleetActivities, SyncPoolsInput, SyncPoolsOutput
from activities.fleet.repository import FleetRepository
from tests.support.paths import DATA, REGIONS_DIR
from workflows.sync_pools import SyncPoolsWorkflow

HISTORY = DATA / "histories" / "sync_pools.json"


async def run_sync(
    env: WorkflowEnvironment, repo: FleetRepository, regions_dir: Path, region: str
) -> tuple[SyncPoolsOutput, str]:
    queue = f"tq-{uuid.uuid4()}"
    fleet = FleetActivities(repo, regions_dir)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        async with Worker(
            env.client,
            task_queue=queue,
            workflows=[SyncPoolsWorkflow],
            activities=[fleet.sync_pools],
            activity_executor=pool,
        ):
            handle = await env.client.start_workflow(
                SyncPoolsWorkflow.run,
                SyncPoolsInput(region=region),
                id=f"sync-{uuid.uuid4()}",
                task_queue=queue,
            )
            out = await handle.result()
            history = await handle.fetch_history()
    return out, history.to_json()


async def test_sync_loads_the_catalogue_and_a_rerun_changes_nothing(
    workflow_env: WorkflowEnvironment, fleet_repo: FleetRepository
) -> None:
    # The session database is shared by the worker's tests (the explain CLI's test syncs
    # r2 too): the first run adds what is not there yet, the rerun nothing.
    before = len(fleet_repo.list_pools("r2"))
    out, history = await run_sync(workflow_env, fleet_repo, REGIONS_DIR, "r2")
    assert out.pools == 144 and out.changed == 144 - before
    again, _ = await run_sync(workflow_env, fleet_repo, REGIONS_DIR, "r2")
    assert again.changed == 0
    assert len(fleet_repo.list_pools("r2")) == 144
    if os.environ.get("SCO_RECORD_HISTORIES"):
        HISTORY.write_text(json.dumps(json.loads(history), indent=1))


async def test_a_broken_region_file_fails_the_workflow_without_retrying(
    workflow_env: WorkflowEnvironment, fleet_repo: FleetRepository, tmp_path: Path
) -> None:
    (tmp_path / "r9.toml").write_text('[region]\nid = "r9"\nhalls = 3\n')
    with pytest.raises(WorkflowFailureError) as err:
        await run_sync(workflow_env, fleet_repo, tmp_path, "r9")
    cause = getattr(
        err.value.cause, "cause", None
    )  # workflow failure ← activity error ← application error
    assert getattr(cause, "type", None) == "RegionFileError"
    assert "r9.toml" in str(cause)


async def test_recorded_history_replays() -> None:
    replayer = Replayer(workflows=[SyncPoolsWorkflow], data_converter=pydantic_data_converter)
    from temporalio.client import WorkflowHistory

    history = WorkflowHistory.from_json("sync-pools", HISTORY.read_text())
    await replayer.replay_workflow(history)
