"""`sco sim estate` as its own process: JSON, table, PNG figures and the README section."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from estate.engine import POLICIES
from tests.support.paths import DATA, REPO
from tests.support.services import run_sco

pytestmark = pytest.mark.timeout(120)


async def test_sim_estate_writes_json_plots_and_readme(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the PNG figures need matplotlib (the dev extra)")
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- estate:begin -->\nold\n<!-- estate:end -->\n\nrest\n")
    out = tmp_path / "estate"
    code, text = await run_sco(
        dict(os.environ),
        "sim", "estate", "--days", "1", "--seed", "3", "--region", "r1", "--tenants", "1",
        "--out", str(out), "--readme", str(readme),
        cwd=REPO,
    )  # fmt: skip
    assert code == 0, text
    data = json.loads((out / "estate.json").read_text())
    assert data["seed"] == 3 and data["regions"] == ["r1"]
    assert [p["policy"] for p in data["policies"]] == list(POLICIES)
    for name in ("cost.png", "reclaims_heatmap.png", "exclusions.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    body = readme.read_text()
    assert "old" not in body and "| sco |" in body and "](estate/cost.png)" in body
    assert body.endswith("rest\n")


async def test_sim_estate_bad_region_is_one_line(tmp_path: Path) -> None:
    code, text = await run_sco(
        dict(os.environ),
        "sim", "estate", "--days", "1", "--region", "r9", "--out", str(tmp_path), "--no-plots",
        cwd=REPO,
    )  # fmt: skip
    assert code != 0
    assert "error: --region: unknown r9; known: r1, r2, r3" in text
    assert "Traceback" not in text


async def test_a_converted_trace_drives_the_simulation(tmp_path: Path) -> None:
    trace = tmp_path / "r1.json"
    code, text = await run_sco(
        dict(os.environ),
        "sim", "trace", "dc", "--csv", str(DATA / "estate" / "azure_v2_sample.csv"),
        "--days", "0.25", "--window", "1", "--region", "r1", "--out", str(trace),
        cwd=REPO,
    )  # fmt: skip
    assert code == 0, text
    assert json.loads(trace.read_text())["format"] == "sco-estate-trace/1"
    out = tmp_path / "estate"
    code, text = await run_sco(
        dict(os.environ),
        "sim", "estate", "--trace", str(trace), "--policy", "sco", "--policy", "karpenter-pco",
        "--tenants", "1", "--out", str(out), "--no-plots",
        cwd=REPO,
    )  # fmt: skip
    assert code == 0, text
    data = json.loads((out / "estate.json").read_text())
    assert data["regions"] == ["r1"] and data["days"] == 0.25
    assert [p["policy"] for p in data["policies"]] == ["sco", "karpenter-pco"]


async def test_a_bad_trace_file_is_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "r1.json"
    trace.write_text(
        json.dumps(
            {"format": "sco-estate-trace/1", "region": "r1", "minutes": 60,
             "pools": {"r1.A.gp.l": {"prices": [[0, "cheap"]]}}}
        )
    )  # fmt: skip
    code, text = await run_sco(
        dict(os.environ),
        "sim", "estate", "--trace", str(trace), "--out", str(tmp_path), "--no-plots",
        cwd=REPO,
    )  # fmt: skip
    assert code != 0
    assert f"error: {trace}: pools.r1.A.gp.l.prices[0]: value 'cheap' is not a number" in text
    assert "Traceback" not in text
    code, text = await run_sco(
        dict(os.environ),
        "sim", "evaluate", "--scenario", "nope", "--out", str(tmp_path), "--no-plots",
        cwd=REPO,
    )  # fmt: skip
    assert code != 0 and "error: scenario 'nope': not in" in text and "Traceback" not in text
