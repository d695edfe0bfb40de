"""The region worker's workflow sandbox re-imports workflow modules only.

Temporal's sandbox runs each workflow module anew per workflow run; everything else
should come through from the host process once (`workflow.unsafe.imports_passed_through`
in every workflow module): models, activity stubs and the pure planning code are not
re-imported per run, which costs the worker memory and each new run CPU time. A module
that slips out of a pass-through block shows up here by name.

Reads the sandbox importer's trace (temporalio 1.35's `_importer.LOG_TRACE`): skipped, not
failed, on an SDK that no longer has it.
"""

from __future__ import annotations

import logging
import sys

import pytest
from temporalio import workflow
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from services.region_worker.service import WORKFLOWS

importer = pytest.importorskip("temporalio.worker.workflow_sandbox._importer")


class _Trace(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage().strip())


def _fresh_imports(lines: list[str]) -> set[str]:
    imported = {
        x.split()[1]
        for x in lines
        if x.startswith("Importing ") and not x.startswith("Importing parent")
    }
    passed = {x.split()[2] for x in lines if x.startswith("Passing module ")}
    return {
        m
        for m in imported - passed
        if m.split(".")[0] not in sys.stdlib_module_names and not m.startswith(("_", "temporalio"))
    }


async def test_the_sandbox_reimports_only_workflow_modules() -> None:
    if not hasattr(importer, "LOG_TRACE"):
        pytest.skip("temporalio's sandbox importer has no trace switch")
    trace = _Trace()
    importer.logger.addHandler(trace)
    level, importer.logger.level = importer.logger.level, logging.DEBUG
    importer.LOG_TRACE = True
    try:
        runner = SandboxedWorkflowRunner()
        for wf in WORKFLOWS:
            runner.prepare_workflow(workflow._Definition.must_from_class(wf))
    finally:
        importer.LOG_TRACE = False
        importer.logger.removeHandler(trace)
        importer.logger.setLevel(level)
    fresh = _fresh_imports(trace.lines)
    assert "workflows.controller.workflow" in fresh  # the probe sees the sandbox import
    assert (
        sorted(
            m
            for m in fresh
            if m != "workflows" and not m.endswith(".workflow") and m != "workflows.sync_pools"
        )
        == []
    )
