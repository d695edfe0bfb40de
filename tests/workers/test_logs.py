"""JSON logs: a real workflow and activity on the time-skipping server, every line one JSON
object, and the workflow id, run id and activity type on every line the SDK writes for them
(contracts/logformat.py, workers/logs.py)."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from agent.cli import main as agent_main
from contracts.logformat import JsonFormatter, configure_logging
from workers.logs import configure_from_settings, prepare_temporal_logging
from workers.settings import LogSettings

pytestmark = pytest.mark.timeout(120)


@activity.defn
async def flaky_step(label: str) -> str:
    """Fails its first attempt, so the SDK logs the failure (with a traceback) itself."""
    activity.logger.info("step %s, attempt %d", label, activity.info().attempt)
    if activity.info().attempt == 1:
        raise RuntimeError("first attempt fails")
    return label


@workflow.defn
class LoggingWorkflow:
    @workflow.run
    async def run(self, label: str) -> str:
        workflow.logger.info("starting %s", label)
        out: str = await workflow.execute_activity(
            flaky_step,
            label,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100)),
        )
        workflow.logger.info("done %s", out)
        return out


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """The test replaces the root logger's handlers and the SDK's message options; put back
    what pytest and the other tests had."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    on_message = (
        workflow.logger.workflow_info_on_message,
        activity.logger.activity_info_on_message,
    )
    yield
    for h in root.handlers[:]:
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    workflow.logger.workflow_info_on_message, activity.logger.activity_info_on_message = on_message


async def test_workflow_and_activity_lines_are_json_with_their_ids(
    workflow_env: WorkflowEnvironment, restored_logging: None
) -> None:
    stream = io.StringIO()
    settings = LogSettings(format="json")
    assert configure_from_settings(settings, stream) == "json"
    prepare_temporal_logging(settings, stream)
    queue, wid = f"tq-{uuid.uuid4()}", f"logs-{uuid.uuid4().hex[:8]}"
    async with Worker(
        workflow_env.client, task_queue=queue, workflows=[LoggingWorkflow], activities=[flaky_step]
    ):
        handle = await workflow_env.client.start_workflow(
            LoggingWorkflow.run, "alpha", id=wid, task_queue=queue
        )
        assert await handle.result() == "alpha"
    run_id = handle.result_run_id

    lines = [line for line in stream.getvalue().splitlines() if line.strip()]
    records: list[dict[str, Any]] = [json.loads(line) for line in lines]  # every line is JSON
    assert records
    for r in records:
        assert {"ts", "level", "logger", "message"} <= r.keys(), r
        assert r["ts"].endswith("+00:00")

    mine = [r for r in records if r.get("workflow_id") == wid]
    in_workflow = [r for r in mine if r["logger"] == "temporalio.workflow"]
    in_activity = [r for r in mine if r["logger"] == "temporalio.activity"]
    assert [r["message"] for r in in_workflow] == ["starting alpha", "done alpha"]
    assert [r["message"] for r in in_activity] == [
        "step alpha, attempt 1",
        "Completing activity as failed",
        "step alpha, attempt 2",
    ]
    for r in in_workflow:
        assert r["run_id"] == run_id and r["workflow_type"] == "LoggingWorkflow"
    for r in in_activity:
        assert r["run_id"] == run_id and r["activity_type"] == "flaky_step"
    failed = in_activity[1]
    assert failed["level"] == "WARNING" and "first attempt fails" in failed["exc_info"]
    # The ids are fields; the SDK's dict is not appended to the message.
    assert not any("{'" in r["message"] for r in mine)
    # Every line the SDK wrote for a workflow or an activity carries its ids.
    for r in records:
        if r["logger"] in {"temporalio.workflow", "temporalio.activity"}:
            assert r.get("workflow_id") and r.get("run_id"), r


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_is_text_on_a_terminal_and_json_otherwise(restored_logging: None) -> None:
    tty = _Terminal()
    assert configure_logging("auto", "INFO", tty) == "text"
    logging.getLogger("sco.test").info("hello %s", "there")
    assert tty.getvalue().rstrip().endswith("INFO sco.test: hello there")

    piped = io.StringIO()
    assert configure_logging("auto", "INFO", piped) == "json"
    logging.getLogger("sco.test").warning("hello", extra={"pool": "r1.A.gp.xl"})
    line = json.loads(piped.getvalue())
    assert line["level"] == "WARNING" and line["pool"] == "r1.A.gp.xl"


def test_a_traceback_stays_on_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, None)
        import sys

        record.exc_info = sys.exc_info()
    out = JsonFormatter().format(record)
    assert "\n" not in out and "ValueError: boom" in json.loads(out)["exc_info"]


def test_the_agent_refuses_an_unknown_log_format(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert agent_main(["--log-format", "yaml"]) == 2
    monkeypatch.setenv("SCO_AGENT_LOG_FORMAT", "yaml")
    assert agent_main(["--check"]) == 2
    assert "SCO_AGENT_LOG_FORMAT: log format 'yaml' is not one of auto, json, text" in (
        capsys.readouterr().err
    )


def test_the_agent_reads_its_log_format_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, restored_logging: None
) -> None:
    monkeypatch.setenv("SCO_AGENT_LOG_FORMAT", "json")
    agent_main(["--check"])
    assert any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
