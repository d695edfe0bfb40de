"""The missing-tool skips and the session summary built from them (tests/support/tools.py)."""

from __future__ import annotations

from tests.support import tools


def test_a_skip_reason_names_its_tools_and_the_summary_counts_them_per_file() -> None:
    slurm = tools.skip_reason([tools.BY_NAME[n] for n in tools.SLURMCTLD])
    torch = tools.skip_reason([tools.BY_NAME["torch"]])
    assert tools.names_in_reason(f"Skipped: {slurm}") == list(tools.SLURMCTLD)
    assert "apt-get install -y --no-install-recommends slurmctld slurm-client munge" in slurm
    assert "pip install torch==2.13.0+cpu" in torch
    lines = tools.summary(
        [
            ("tests/a.py", f"Skipped: {slurm}"),
            ("tests/b.py", slurm),
            ("tests/b.py", slurm),
            ("tests/c.py", torch),
            ("tests/d.py", "Skipped: no NATS at nats://127.0.0.1:4222"),  # not a tool's
        ]
    )
    assert lines[0] == "4 tests skipped for missing tools:"
    assert "  slurmctld, slurm-client, munge: 3 in tests/a.py, tests/b.py" in lines
    assert "  torch: 1 in tests/c.py" in lines
    assert "slurmctld slurm-client munge" in lines[-1] and "torch==2.13.0+cpu" in lines[-1]


def test_no_summary_when_nothing_skipped_for_a_tool() -> None:
    assert (
        tools.summary([("tests/d.py", "Skipped: fault injection exists only in the simulator")])
        == []
    )
