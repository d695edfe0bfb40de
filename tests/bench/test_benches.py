"""Every benchmark, in its tiny configuration (seconds), through the same runner as
`make bench`: a bench that breaks fails here, not on the day someone runs `make bench`.
A bench whose tool is missing (bench/needs.py) skips with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.report import Report, judge
from bench.run_all import (
    BEGIN,
    BENCHES,
    END,
    TINY_TIMEOUT_S,
    Bench,
    markdown,
    replace_section,
    run_one,
)


# The runner stops a tiny bench after TINY_TIMEOUT_S; the slowest (control: a dev server
# and a `sco` process) takes ~35 s on this machine.
@pytest.mark.timeout(TINY_TIMEOUT_S + 10)
@pytest.mark.parametrize("bench", BENCHES, ids=[b.name for b in BENCHES])
def test_tiny_bench_measures_every_figure(bench: Bench) -> None:
    if (reason := bench.needs()) is not None:
        pytest.skip(f"{bench.name}: {reason}")
    out = run_one(bench, tiny=True)
    assert out["status"] == "ok", out.get("reason")
    assert out["bench"] == bench.name
    assert out["missing"] == 0
    assert out["machine"]["cpus"] >= 1
    assert len(out["machine"]["loadavg_start"]) == 3
    assert out["figures"], "a bench that reports nothing measured nothing"
    for f in out["figures"]:
        assert isinstance(f["value"], float), f
        assert f["unit"] and f["anchor"], f
        assert (f["target"] is None) == (f["comparator"] is None), f
        assert f["met"] == judge(f["value"], f["target"], f["comparator"]), f


def test_a_measurement_that_did_not_happen_is_null_with_reason_and_fails(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = Report("t", {})
    report.figure("fast", 10.0, "ms", anchor="a", target=50, comparator="<=")
    report.measurement_missing("cli", "no create within 10 s", "s", anchor="b", target=2.0)
    assert report.emit() == 1
    printed = json.loads(capsys.readouterr().out)
    fast, cli = printed["figures"]
    assert fast["met"] is True
    assert cli["value"] is None and cli["met"] is None
    assert cli["reason"] == "no create within 10 s"
    assert printed["missing"] == 1
    with pytest.raises(ValueError, match="needs a reason"):
        report.figure("x", None, "s", anchor="c")


def test_report_table_marks_met_missed_and_not_run_and_replaces_readme_section(
    tmp_path: Path,
) -> None:
    report = Report("planner", {})
    report.figure("plan_p95", 30.0, "ms", anchor="r1", target=50, comparator="<=")
    report.figure("gap", 1.5, "%", anchor="MILP", target=1.0, comparator="<=")
    report.figure("throughput", 900.0, "events/s", anchor="backlog")
    full = {
        "generated_at": "now",
        "tiny": False,
        "benches": [
            {**report.as_dict(), "status": "ok"},
            {"bench": "slurm_resume", "status": "not run", "reason": "slurmctld missing"},
        ],
        "not_run": 1,
        "not_measured": 0,
    }
    table = markdown(full)
    assert "1 met, 1 missed, 1 without a target" in table
    assert "| planner | plan_p95 | 30 ms | <= 50 | r1 | met |" in table
    assert "| planner | throughput | 900 events/s | — | backlog | no target |" in table
    assert "| planner | gap | 1.5 % | <= 1 | MILP | **missed** |" in table
    assert "**not run**: slurmctld missing" in table
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{BEGIN}\nold table\n{END}\n\nafter\n")
    replace_section(readme, table)
    text = readme.read_text()
    assert "old table" not in text and table in text and text.endswith("after\n")
