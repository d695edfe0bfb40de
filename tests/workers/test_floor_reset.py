"""`sco floor reset` and `sco floor status` on a wedged keeper (issue 37).

The reset point is pure code over the history (workers/floor_reset.py): on the recorded
wedged keeper it is event 3548, the reset that brought it back by hand. On the dev server a
keeper whose every workflow task fails is reported "not answering" with the command to run,
and that command brings it back; the SDK's failed-task counter that SCOWorkflowTaskFailing
reads counts the failing attempts."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import urllib.request
import uuid
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.floor.models import floor_workflow_id
from tests.support import replay_all, services
from tests.support.paths import DATA, REGIONS_DIR, REPO
from tests.support.wait import eventually_async
from workers.floor_reset import failing_event, reset_point, trailing_failures
from workflows import search_attributes as sa
from workflows.floor.models import FloorState, FloorStatus

pytestmark = pytest.mark.timeout(180)


def test_the_recorded_wedged_keeper_resets_to_the_task_before_the_stale_timer() -> None:
    raw = gzip.decompress(
        (DATA / "histories" / "floor-keeper-nondeterminism-after-worker-kill.json.gz").read_bytes()
    )
    history = WorkflowHistory.from_json("floor-r1-llm-train", raw.decode())
    error = "Activity machine does not handle this event: HistoryEvent(id: 3557, TimerStarted)"
    assert failing_event(error) == 3557
    assert reset_point(history.events, 3557) == 3548


def _event(event_id: int, kind: int, started: int = 0) -> HistoryEvent:
    ev = HistoryEvent(event_id=event_id, event_type=kind)  # type: ignore[arg-type]
    if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
        ev.workflow_task_completed_event_attributes.started_event_id = started
    return ev


def test_failing_tasks_after_the_last_completed_one_reset_to_it() -> None:
    done, failed = (
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
    )
    events = [_event(4, done, 3), _event(8, done, 7), _event(11, failed), _event(14, failed)]
    assert [e.event_id for e in trailing_failures(events)] == [11, 14]
    assert reset_point(events, None) == 7
    assert reset_point(events[:2], None) is None  # nothing failing: nothing to reset
    assert reset_point(events, 9) == 3  # replay fails in the task that completed at 8


#: Flipped by the test: until then every workflow task after the first fails.
BROKEN = {"on": True}


@workflow.defn(name="FloorKeeperWorkflow")
class WedgedKeeper:
    """A keeper whose code raises after its first task: Temporal retries the task forever,
    the workflow stays Running, queries are refused: the wedge, without waiting for a kill."""

    @workflow.run
    async def run(self, contract: str) -> None:
        self._contract = contract
        await workflow.sleep(1)  # one completed task (the timer) before the broken one
        if BROKEN["on"]:
            raise RuntimeError("deliberately broken workflow task")
        await workflow.wait_condition(lambda: False)

    @workflow.query
    def status(self) -> FloorStatus:
        return FloorStatus(contract=self._contract, region="r1", state=FloorState.HOLDING)


async def test_a_wedged_keeper_is_not_answering_and_floor_reset_brings_it_back(
    region_client: Client,
) -> None:
    env = {
        **os.environ,
        "SCO_TEMPORAL__ADDRESS": region_client.service_client.config.target_host,
        "SCO_TEMPORAL__NAMESPACE_PREFIX": services.namespace_prefix(region_client),
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_DATA_DIR": f"/tmp/sco-{uuid.uuid4().hex[:8]}",
    }
    contract, queue = f"wedged-{uuid.uuid4().hex[:6]}", f"tq-{uuid.uuid4()}"
    wid = floor_workflow_id("r1", contract)
    BROKEN["on"] = True
    # The worker's client on a runtime with the SDK's Prometheus endpoint, as the region
    # worker runs (services/region_worker/service.py): what SCOWorkflowTaskFailing reads.
    port = services.free_port()
    runtime = Runtime(
        telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{port}"))
    )
    worker_client = await Client.connect(
        region_client.service_client.config.target_host,
        namespace=region_client.namespace,
        runtime=runtime,
        data_converter=pydantic_data_converter,
    )
    async with Worker(
        worker_client,
        task_queue=queue,
        workflows=[WedgedKeeper],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await region_client.start_workflow(
            "FloorKeeperWorkflow",
            contract,
            id=wid,
            task_queue=queue,
            search_attributes=TypedSearchAttributes([SearchAttributePair(sa.REGION, "r1")]),
        )

        async def wedged() -> bool:
            history = await handle.fetch_history()
            return len(trailing_failures(history.events)) >= 2

        await eventually_async(wedged, timeout=60, what=f"{wid} failing its tasks", retrying=())

        def failed_tasks() -> float:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("temporal_workflow_task_execution_failed{")
                and 'workflow_type="FloorKeeperWorkflow"' in line
            )

        assert await asyncio.to_thread(failed_tasks) >= 2  # the series the alert reads
        # The chaos cases' replay-everything check (tests/support/replay_all.py) names it.
        assert any(
            x.startswith(f"{wid}: ") for x in await replay_all.nondeterministic(region_client)
        )

        async def listed_not_answering() -> str | None:
            argv = ("floor", "status", "--json", "--region", "r1")
            code, out = await services.run_sco(env, *argv, cwd=REPO)
            rows = json.loads(out) if code == 0 else []
            return next((x for x in rows if isinstance(x, str) and "not answering" in x), None)

        row = await eventually_async(
            listed_not_answering, timeout=60, what="floor status listing the keeper", retrying=()
        )
        assert row.startswith(wid) and f"sco floor reset {contract} --region r1" in row

        argv = ("floor", "reset", contract, "--region", "r1", "--by", "ops", "--reason", "wedged")
        code, out = await services.run_sco(env, *argv, "--dry-run", cwd=REPO)
        assert code == 0 and "would be reset to event" in out and "not reset" in out, out
        code, out = await services.run_sco(env, *argv, "--event-id", "3", cwd=REPO)
        assert code == 0 and "reset to event 3" in out, out
        BROKEN["on"] = False  # the code fixed: the new run replays to event 3 and goes on

        async def answers() -> bool:
            st = await region_client.get_workflow_handle(wid).query(
                WedgedKeeper.status, rpc_timeout=timedelta(seconds=5)
            )
            return st.contract == contract

        await eventually_async(answers, timeout=60, what=f"{wid} answering after the reset")
        await region_client.get_workflow_handle(wid).terminate("test over")
