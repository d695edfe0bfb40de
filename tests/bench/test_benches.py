"""Every benchmark, in its tiny configuration (seconds), through the same runner as
`make bench`: a bench that breaks fails here, not on the day someone runs `make bench`.
A bench whose tool is missing (bench/needs.py) skips with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import needs
from bench.report import REPORT_FILE_ENV, Report, judge
from bench.run_all import (
    BEGIN,
    BENCHES,
    END,
    ROOT,
    STOP_GRACE_S,
    Bench,
    child_env,
    markdown,
    replace_section,
    run_one,
    run_stopping_gracefully,
)


# The runner stops a tiny bench after its tiny_timeout_s (TINY_TIMEOUT_S unless the bench
# starts several processes); control (a dev server and a `sco` process) takes ~35 s here.
@pytest.mark.parametrize(
    "bench",
    [
        # services: every bench drives the real services (or the test cloud) it measures;
        # testcloud: one on the test cloud shares its xdist worker with the cloud's other
        # tests (tests/support/parallel.py), else its servers take their hosts' capacity
        pytest.param(
            b,
            id=b.name,
            marks=[
                pytest.mark.timeout(b.tiny_timeout_s + STOP_GRACE_S + 10),
                pytest.mark.services,
                *([pytest.mark.testcloud] if b.needs is needs.testcloud else []),
                # the memory bench brings up a whole box (its own ports and data dir)
                *([pytest.mark.devbox] if b.name == "memory_hour" else []),
            ],
        )
        for b in BENCHES
    ],
)
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


RUNS = ROOT / "bench" / "results" / "runs"


def _run_all(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "bench/run_all.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_recorded_run_joins_the_report_and_the_readme_without_running_anything(
    tmp_path: Path,
) -> None:
    earlier = {
        "generated_at": "2026-12-01 21:37 UTC",
        "tiny": False,
        "benches": [{"bench": "planner", "status": "not run", "reason": "kept as it was"}],
    }
    (tmp_path / "latest.json").write_text(json.dumps(earlier))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{BEGIN}\nold\n{END}\nrest\n")
    soak = RUNS / "2026-12-02-ledger_soak_cap512.json"
    proc = _run_all(
        "--out", str(tmp_path), "--readme", str(readme), "--record", f"ledger_soak={soak}"
    )
    assert proc.returncode == 0, proc.stderr
    assert "bench " not in proc.stderr  # nothing ran
    report = json.loads((tmp_path / "latest.json").read_text())
    assert [b["bench"] for b in report["benches"]] == ["planner", "ledger_soak"]
    row = report["benches"][1]
    assert row["status"] == "ok" and row["run_at"] == f"recorded in {soak}"
    assert row["figures"] == json.loads(soak.read_text())["figures"]
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n") and "old" not in text
    assert f"run recorded in {soak}" in text and "| planner | — |" in text


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("ledger_soak", "expected NAME=FILE"),
        ("nosuch=x.json", "unknown bench nosuch"),
        ("ledger_soak=/nonexistent.json", "/nonexistent.json: No such file or directory"),
        (f"saturation={RUNS / '2026-12-02-early_warning.json'}", "field bench is 'early_warning'"),
        ("ledger_soak={bad}", "not JSON"),
    ],
)
def test_a_bad_record_is_one_line_naming_it_and_leaves_the_report_alone(
    tmp_path: Path, spec: str, says: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    (tmp_path / "latest.json").write_text("{}")
    proc = _run_all("--out", str(tmp_path), "--record", spec.format(bad=bad))
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "--record" in lines[0], proc.stderr
    assert (tmp_path / "latest.json").read_text() == "{}"


def test_the_test_cloud_benches_find_the_cloud_where_the_check_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The needs check accepts the test cloud's clouds.yaml without OS_CLIENT_CONFIG_FILE;
    the bench it lets run must be pointed at the same file (it was not: "Cloud sco-testcloud
    was not found")."""
    monkeypatch.delenv("OS_CLIENT_CONFIG_FILE", raising=False)
    env = child_env(Path("/tmp/report.json"))
    assert env["OS_CLIENT_CONFIG_FILE"] == str(ROOT / ".sco" / "testcloud" / "clouds.yaml")
    assert env[REPORT_FILE_ENV] == "/tmp/report.json"
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", "/etc/openstack/clouds.yaml")
    assert child_env(Path("/tmp/r.json"))["OS_CLIENT_CONFIG_FILE"] == "/etc/openstack/clouds.yaml"


def test_memory_growth_is_the_last_half_slope_times_its_length() -> None:
    from bench.memory_hour_bench import end_mb, growth_mb

    flat = [(t * 30.0, 50.0 + (0.3 if t % 2 else -0.3)) for t in range(40)]
    grown = growth_mb(flat)
    assert grown is not None and abs(grown) < 0.1  # wandering is not growth
    # 1 MB a minute, then a plateau over the last half: only the last half counts.
    rising_then_flat = [(t * 60.0, 50.0 + min(t, 10)) for t in range(21)]
    assert growth_mb(rising_then_flat) == pytest.approx(0.0, abs=1e-9)
    leak = [(t * 60.0, 50.0 + 0.5 * t) for t in range(21)]  # 0.5 MB/min for 20 min
    assert growth_mb(leak) == pytest.approx(5.0)
    assert growth_mb(leak[:3]) is None  # too few samples to say
    # Samples that caught the worker's ledger child (~230 MB for seconds), one of them the
    # last: a least-squares line said 25.9 MB; the growth is still 5.
    spiked = [(t, v + 230.0 if i in (11, 20) else v) for i, (t, v) in enumerate(leak)]
    assert growth_mb(spiked) == pytest.approx(5.0)
    assert end_mb(spiked) == pytest.approx(59.0)  # the last 5 samples' median, no spike


def test_an_overrun_bench_is_interrupted_and_its_clean_up_runs(tmp_path: Path) -> None:
    # A bench on the test cloud deletes what it made in `finally`; a kill on overrun left
    # its servers in the halls the next test's floor needed.
    cleaned = tmp_path / "cleaned"
    script = tmp_path / "overrun.py"
    script.write_text(
        "import asyncio, pathlib, sys\n"
        "async def main() -> None:\n"
        "    try:\n"
        "        await asyncio.sleep(600)\n"
        "    finally:\n"
        f"        pathlib.Path({str(cleaned)!r}).write_text('done')\n"
        "asyncio.run(main())\n"
    )
    # 15 s: the child's interpreter is up and in its `try` by then, even on a loaded machine.
    # Under pytest-xdist (whose workers ignore SIGINT) an interrupt that did not reach the
    # bench would leave it asleep past the grace, killed, and nothing written.
    done, overran = run_stopping_gracefully([sys.executable, str(script)], {}, timeout=15)
    assert overran and done.returncode != 0
    assert cleaned.read_text() == "done"
