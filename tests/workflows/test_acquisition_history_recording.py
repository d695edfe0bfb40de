"""Recording acquisition histories (SCO_RECORD_HISTORIES=1) adds a file per recording and
never overwrites one, and a scenario's every recording is listed for replay (issue 28:
re-recording `acquisition_paused` used to replace the history from before the operator
decisions patch, the one path that patch keeps for old workflows)."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio.client import WorkflowHandle, WorkflowHistory

from tests.support import histories

SCENARIO = "acquisition_paused"


class FakeHandle:
    """What `record` uses of a workflow handle: the run's history."""

    def __init__(self, history: WorkflowHistory) -> None:
        self.history = history

    async def fetch_history(self) -> WorkflowHistory:
        return self.history


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    """A copy of the checked-in `acquisition_paused` history and its id."""
    shutil.copy(histories.DIR / f"{SCENARIO}.json", tmp_path)
    ids = json.loads(histories.IDS.read_text())
    (tmp_path / histories.IDS_FILE).write_text(json.dumps({SCENARIO: ids[SCENARIO]}))
    return tmp_path


def _history(workflow_id: str) -> WorkflowHistory:
    original = histories.load(SCENARIO)
    return WorkflowHistory(workflow_id=workflow_id, events=original.events)


async def _record(workflow_id: str, name: str, directory: Path) -> str | None:
    handle = cast(WorkflowHandle[Any, Any], FakeHandle(_history(workflow_id)))
    return await histories.record(handle, name, directory=directory)


def _bytes(path: Path) -> bytes:
    return path.read_bytes()


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def test_without_the_switch_nothing_is_written(
    directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCO_RECORD_HISTORIES", raising=False)
    before = _names(directory)
    assert await _record("acq-new", SCENARIO, directory) is None
    assert _names(directory) == before


async def test_each_recording_is_a_new_file_and_the_old_ones_stay(
    directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCO_RECORD_HISTORIES", "1")
    original = _bytes(directory / f"{SCENARIO}.json")
    stems = [await _record(f"acq-{n}", SCENARIO, directory) for n in (1, 2)]
    date = datetime.now(UTC).strftime("%Y%m%d")
    assert stems == [f"{SCENARIO}.{date}.1", f"{SCENARIO}.{date}.2"]
    assert _bytes(directory / f"{SCENARIO}.json") == original  # never overwritten
    assert histories.recorded(SCENARIO, directory=directory) == [SCENARIO, *stems]
    ids = json.loads(_bytes(directory / histories.IDS_FILE))
    assert ids[stems[0]] == "acq-1" and ids[stems[1]] == "acq-2"
    assert ids[SCENARIO] == histories.load(SCENARIO).workflow_id
    for stem, workflow_id in zip(stems, ("acq-1", "acq-2"), strict=True):
        assert stem is not None
        loaded = histories.load(stem, directory=directory)
        assert loaded.workflow_id == workflow_id and loaded.events == _history("x").events


async def test_a_scenario_first_recorded_keeps_its_plain_name(
    directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCO_RECORD_HISTORIES", "1")
    stem = await _record("acq-first", "acquisition_new_scenario", directory)
    assert stem == "acquisition_new_scenario"
    assert histories.recorded("acquisition_new_scenario", directory=directory) == [stem]
    # Scenarios whose names extend another's are not taken for its recordings.
    assert histories.recorded(SCENARIO, directory=directory) == [SCENARIO]


@pytest.mark.parametrize(
    ("files", "listed"),
    [
        pytest.param([f"{SCENARIO}.json"], [SCENARIO], id="the-first-only"),
        pytest.param(
            [f"{SCENARIO}.20261204.10.json", f"{SCENARIO}.20261204.2.json", f"{SCENARIO}.json"],
            [SCENARIO, f"{SCENARIO}.20261204.2", f"{SCENARIO}.20261204.10"],
            id="sequence-sorted-as-numbers",
        ),
        pytest.param(
            [f"{SCENARIO}.20270101.1.json", f"{SCENARIO}.20261231.3.json"],
            [f"{SCENARIO}.20261231.3", f"{SCENARIO}.20270101.1"],
            id="dates-oldest-first",
        ),
        pytest.param(
            [f"{SCENARIO}_more.json", f"{SCENARIO}.json.gz", f"{SCENARIO}.notes.json"],
            [],
            id="other-files-left-out",
        ),
    ],
)
def test_recorded_lists_a_scenarios_files_oldest_first(
    tmp_path: Path, files: list[str], listed: list[str]
) -> None:
    for name in files:
        (tmp_path / name).write_text("{}")
    assert histories.recorded(SCENARIO, directory=tmp_path) == listed


def test_the_checked_in_pre_patch_pause_history_is_among_those_replayed() -> None:
    assert histories.recorded(SCENARIO)[0] == SCENARIO
