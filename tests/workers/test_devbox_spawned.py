"""`sco dev up` interrupted or failed while a service starts: the process that start had
spawned is stopped, even though the start never returned its record.

A service's start spawns its process, then waits for it to answer. A Ctrl-C in that wait
(or a wait that timed out) used to leave the process running with nobody holding its
record: an orphaned Kafka broker outlived `make test-under-load`. Here a real process
(`sleep`) is spawned by a stand-in service, and the interrupt is raised at each point
deterministically: after the spawn, in the spawn itself, or as a failed wait."""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.devbox import process
from workers.devbox.box import Box
from workers.devbox.process import DevboxError, ProcessRecord
from workers.devbox.services import Health, Service
from workers.settings import Settings

SLEEP = shutil.which("sleep") or "/bin/sleep"


class _SpawnsThen(Service):
    """Spawns `sleep 300` (a real process), then does `then` instead of answering."""

    name = "stand-in"
    managed_only = True

    def __init__(self, settings: Settings, then: Callable[[], None]) -> None:
        super().__init__(settings)
        self._then = then
        self.spawned: ProcessRecord | None = None

    @property
    def address(self) -> str:
        return "nowhere"

    def probe(self) -> Health:
        return Health(False, "never answers")

    def start(self) -> ProcessRecord:
        self.spawned = process.start([SLEEP, "300"], self._log())
        self._then()
        raise AssertionError("`then` was to interrupt or fail the start")


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    monkeypatch.setenv("SCO_DATA_DIR", str(tmp_path / "sco"))
    yield Settings()


def _up(settings: Settings, svc: Service, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Box.up with `svc` as its only service; the steps it reported."""
    steps: list[str] = []
    monkeypatch.setattr(Box, "services", lambda self, **_: [svc])
    box = Box(settings, on_step=lambda name, detail: steps.append(f"{name}: {detail}"))
    box.up()
    return steps


def _interrupt() -> None:
    signal.raise_signal(signal.SIGINT)  # Box.up's own handler takes it


def test_an_interrupt_after_the_spawn_stops_the_process_start_had_not_returned(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = _SpawnsThen(settings, _interrupt)
    with pytest.raises(KeyboardInterrupt):
        _up(settings, svc, monkeypatch)
    assert svc.spawned is not None
    assert not process.alive(svc.spawned), "the spawned sleep outlived the interrupted up"
    assert Box(settings).state_file.read().processes == {}


def test_a_start_that_fails_after_its_spawn_stops_the_process(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_ready() -> None:
        raise DevboxError("stand-in: not ready after 30 s")

    svc = _SpawnsThen(settings, not_ready)
    with pytest.raises(DevboxError, match="not ready"):
        _up(settings, svc, monkeypatch)
    assert svc.spawned is not None
    assert not process.alive(svc.spawned)


def test_an_interrupt_during_the_spawn_waits_until_the_process_is_recorded(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal lands after the fork, before `start` has a record: held, then raised."""
    forked: list[subprocess.Popen[Any]] = []
    real_popen = subprocess.Popen

    def popen_then_interrupt(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        forked.append(real_popen(*args, **kwargs))
        _interrupt()  # inside start, between the fork and the record
        return forked[-1]

    monkeypatch.setattr(subprocess, "Popen", popen_then_interrupt)  # process.start's
    svc = _SpawnsThen(settings, lambda: None)
    with pytest.raises(KeyboardInterrupt):
        _up(settings, svc, monkeypatch)
    (proc,) = forked
    assert svc.spawned is None, "start returned: the interrupt was not raised inside it"
    # Stopped and reaped by up's unwind (process.stop), so poll() answers at once.
    assert proc.poll() is not None, "the fork outlived the interrupted up"


def test_outside_up_a_start_records_nothing_and_signals_pass(tmp_path: Path) -> None:
    """No `spawning()` block: start only starts (the CLI's own processes, the tests')."""
    rec = process.start([SLEEP, "300"], tmp_path / "sleep.log")
    try:
        assert process.alive(rec)
    finally:
        process.stop(rec)
    assert not process.alive(rec)
