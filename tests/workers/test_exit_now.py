"""Short-lived programs that ran a Temporal client leave through `os._exit`
(workers/exit_now.py): the runtime's threads can abort interpreter teardown into a core
file (slurmctld's power programs) or an exit -6 after the report was printed (benches).
Whatever happens inside, the exit code is clear."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import workers.slurm_power_programs as programs
from tests.support.paths import REPO
from workers.exit_now import run_and_exit


class Exited(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_exit(code: int) -> None:
        raise Exited(code)

    monkeypatch.setattr("workers.exit_now.os._exit", fake_exit)
    # In this process they are pytest's own (the session's NATS server is stopped by one).
    monkeypatch.setattr("workers.exit_now.atexit._run_exitfuncs", lambda: None)


@pytest.mark.parametrize(
    ("raised", "code"),
    [(RuntimeError("boom"), 1), (SystemExit(2), 2), (KeyboardInterrupt(), 1)],
)
def test_an_unexpected_exception_still_leaves_without_teardown(
    exits: None, capsys: pytest.CaptureFixture[str], raised: BaseException, code: int
) -> None:
    def main() -> int:
        raise raised

    with pytest.raises(Exited) as got:
        run_and_exit(main)
    assert got.value.code == code
    if code == 1:
        assert type(raised).__name__ in capsys.readouterr().err


@pytest.mark.parametrize(("returned", "code"), [(0, 0), (3, 3), (None, 0)])
def test_a_normal_return_keeps_its_code(exits: None, returned: int | None, code: int) -> None:
    with pytest.raises(Exited) as got:
        run_and_exit(lambda: returned)
    assert got.value.code == code


def test_atexit_handlers_run_before_the_exit(tmp_path: Path) -> None:
    # A bench's test NATS server is stopped by an atexit handler; os._exit skips them.
    stopped = tmp_path / "stopped"
    program = (
        "import atexit, pathlib\n"
        "from workers.exit_now import run_and_exit\n"
        f"atexit.register(pathlib.Path({str(stopped)!r}).write_text, 'yes')\n"
        "run_and_exit(lambda: 3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert stopped.read_text() == "yes"


#: The benches that run a Temporal client or worker in their own process.
TEMPORAL_BENCHES = (
    "control_bench",
    "controller_tick_bench",
    "early_warning_bench",
    "floor_bench",
    "floor_testcloud_bench",
    "operator_path_bench",
    "saturation_bench",
)


@pytest.mark.parametrize(
    "program",
    [Path(programs.__file__), *(REPO / "bench" / f"{name}.py" for name in TEMPORAL_BENCHES)],
    ids=lambda p: p.stem,
)
def test_programs_that_run_temporal_leave_through_it(program: Path) -> None:
    main_block = program.read_text().split('if __name__ == "__main__":', 1)[1]
    assert "run_and_exit(" in main_block, program
