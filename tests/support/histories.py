"""Recorded workflow histories: written when SCO_RECORD_HISTORIES=1, replayed always.

A history recorded from a real run and replayed against today's code fails when a change
breaks determinism: the signal to use `workflow.patched` for running workflows.
"""

from __future__ import annotations

import json
import os
from typing import Any

from temporalio.client import WorkflowHandle, WorkflowHistory

from tests.support.paths import DATA

DIR = DATA / "histories"
IDS = DIR / "workflow_ids.json"


async def record(handle: WorkflowHandle[Any, Any], name: str) -> None:
    """Save the handle's current run's history as tests/data/histories/<name>.json, when asked."""
    if not os.environ.get("SCO_RECORD_HISTORIES"):
        return
    history = await handle.fetch_history()
    (DIR / f"{name}.json").write_text(json.dumps(json.loads(history.to_json()), indent=1) + "\n")
    ids = json.loads(IDS.read_text()) if IDS.exists() else {}
    ids[name] = history.workflow_id
    IDS.write_text(json.dumps(ids, indent=1, sort_keys=True) + "\n")


def load(name: str) -> WorkflowHistory:
    """A recorded history under its original workflow id: workflows that derive ids from
    their own (token request ids, child ids) replay only under that id."""
    ids = json.loads(IDS.read_text())
    return WorkflowHistory.from_json(ids[name], (DIR / f"{name}.json").read_text())
