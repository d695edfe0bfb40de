"""Recorded workflow histories: written when SCO_RECORD_HISTORIES=1, replayed always.

A history recorded from a real run and replayed against today's code fails when a change
breaks determinism: the signal to use `workflow.patched` for running workflows.

A scenario (`acquisition_paused`, say) keeps every history ever recorded for it: the first
one as `<scenario>.json`, each later recording as a file of its own,
`<scenario>.<UTC date>.<n>.json`. Recording never overwrites one, so a history from before
a patch (the code path old workflows still take) keeps being replayed beside the new ones;
`recorded(scenario)` lists them all, oldest first.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHandle, WorkflowHistory

from tests.support.paths import DATA

DIR = DATA / "histories"
IDS_FILE = "workflow_ids.json"
IDS = DIR / IDS_FILE


def _ids_path(directory: Path) -> Path:
    return directory / IDS_FILE


@contextmanager
def _ids_locked(directory: Path) -> Iterator[dict[str, str]]:
    """The workflow-id index, read and written back under a lock (pytest-xdist workers
    record at once)."""
    with _ids_path(directory).open("a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        ids: dict[str, str] = json.loads(text) if text.strip() else {}
        yield ids
        f.seek(0)
        f.truncate()
        f.write(json.dumps(ids, indent=1, sort_keys=True) + "\n")


def _new_file(directory: Path, name: str, text: str) -> str:
    """Write `text` to a file of its own for scenario `name`; its stem. Never overwrites:
    the file is created exclusively, the next free sequence number taken on a clash."""
    date = datetime.now(UTC).strftime("%Y%m%d")
    n = 1
    while True:
        stem = f"{name}.{date}.{n}"
        try:
            with (directory / f"{stem}.json").open("x") as f:
                f.write(text)
            return stem
        except FileExistsError:
            n += 1


async def record(
    handle: WorkflowHandle[Any, Any], name: str, *, directory: Path = DIR
) -> str | None:
    """Save the handle's current run's history for scenario `name` in a new file, when
    SCO_RECORD_HISTORIES is set; its stem (None when not recording)."""
    if not os.environ.get("SCO_RECORD_HISTORIES"):
        return None
    history = await handle.fetch_history()
    text = json.dumps(json.loads(history.to_json()), indent=1) + "\n"
    first = directory / f"{name}.json"
    stem = name
    try:
        with first.open("x") as f:  # a scenario's first recording keeps its plain name
            f.write(text)
    except FileExistsError:
        stem = _new_file(directory, name, text)
    with _ids_locked(directory) as ids:
        ids[stem] = history.workflow_id
    return stem


def _order(name: str, stem: str) -> tuple[str, int]:
    if stem == name:
        return ("", 0)
    _, date, n = stem.rsplit(".", 2)
    return (date, int(n))


def recorded(name: str, *, directory: Path = DIR) -> list[str]:
    """Every recorded history of scenario `name` (stems for `load`), oldest first."""
    pattern = re.compile(rf"{re.escape(name)}(\.\d{{8}}\.\d+)?\.json")
    stems = [p.name[: -len(".json")] for p in directory.iterdir() if pattern.fullmatch(p.name)]
    return sorted(stems, key=lambda s: _order(name, s))


def load(stem: str, *, directory: Path = DIR) -> WorkflowHistory:
    """A recorded history (`recorded` gives the stems; a scenario's name is its first)
    under its original workflow id: workflows that derive ids from their own (token
    request ids, child ids) replay only under that id."""
    ids = json.loads(_ids_path(directory).read_text())
    return WorkflowHistory.from_json(ids[stem], (directory / f"{stem}.json").read_text())
