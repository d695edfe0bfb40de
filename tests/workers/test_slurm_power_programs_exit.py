"""slurmctld runs `python -m workers.slurm_power_programs`: whatever happens inside, the
program leaves through os._exit (no interpreter teardown, which the Temporal client's
runtime threads can abort into a core file) with a clear exit code."""

from __future__ import annotations

import pytest

import workers.slurm_power_programs as programs


class Exited(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_exit(code: int) -> None:
        raise Exited(code)

    monkeypatch.setattr("workers.slurm_power_programs.os._exit", fake_exit)


@pytest.mark.parametrize(
    ("raised", "code"),
    [(RuntimeError("boom"), 1), (SystemExit(2), 2), (KeyboardInterrupt(), 1)],
)
def test_an_unexpected_exception_still_leaves_without_teardown(
    exits: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raised: BaseException,
    code: int,
) -> None:
    def main() -> int:
        raise raised

    monkeypatch.setattr(programs, "main", main)
    with pytest.raises(Exited) as got:
        programs._exit_without_teardown()
    assert got.value.code == code
    if code == 1:
        assert type(raised).__name__ in capsys.readouterr().err


def test_a_normal_return_keeps_its_code(exits: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(programs, "main", lambda: 0)
    with pytest.raises(Exited) as got:
        programs._exit_without_teardown()
    assert got.value.code == 0
