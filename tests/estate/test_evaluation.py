"""The issue-34 evaluation on tiny windows: every comparator and ablation under one set
of measures, a warm start for everyone, paired 95 % intervals, the best baseline, and the
frozen parameters checked (estate/evaluate.py)."""

from __future__ import annotations

import importlib.util
import json
import math
from functools import cache
from pathlib import Path

import pytest

from contracts.model import Contract
from contracts.region import Region, load_regions
from contracts.source import read_contracts
from estate.config import EstateConfig
from estate.engine import ABLATIONS, BASELINES, POLICIES, simulate
from estate.evaluate import (
    FROZEN,
    FrozenError,
    Window,
    compare,
    config,
    evaluate,
    interval,
    load_frozen,
    t975,
    table,
)
from tests.support.paths import DATA, EXAMPLES, REGIONS_DIR

pytestmark = pytest.mark.timeout(60)


@cache
def _estate() -> tuple[dict[str, Region], list[Contract]]:
    regions = load_regions(REGIONS_DIR)
    sources, _ = read_contracts(EXAMPLES)
    return regions, [s.contract for s in sources]


def test_the_interval_is_students_t() -> None:
    assert t975(9) == 2.262 and abs(t975(60) - 2.000) < 0.002
    i = interval([1.0, 2.0, 3.0, 4.0])
    half = 3.182 * math.sqrt(5 / 3) / 2
    assert i.mean == 2.5 and abs(i.high - (2.5 + half)) < 1e-9 and i.n == 4
    assert interval([1.0]).low == -math.inf


def _window(i: int, lost: dict[str, float], cost: dict[str, float]) -> Window:
    return Window(
        scenario="s",
        label=f"w{i}",
        source="test",
        metrics={
            p: {
                "cost_per_served_unit_hour": cost[p],
                "unserved_unit_hours": 1.0,
                "p99_time_to_capacity_minutes": 3.0,
                "work_lost_per_1000_unit_hours": lost[p],
                "below_floor_minutes": 0.0,
                "fallback_refused_units": 0.0,
                "voluntary_releases": 0.0,
            }
            for p in lost
        },
    )


def test_sco_is_measured_against_the_best_baseline() -> None:
    windows = [
        _window(
            i,
            {"sco": 0.5 + 0.01 * i, "price-only": 2.0, "karpenter-pco": 1.0 + 0.02 * i},
            {"sco": 1.02, "price-only": 1.0, "karpenter-pco": 1.0},
        )
        for i in range(10)
    ]
    report = compare("s", "test", windows)
    assert report.best_baseline == "karpenter-pco"
    c = next(c for c in report.comparisons if c.baseline == "karpenter-pco")
    assert c.lost.mean == pytest.approx((0.545 - 1.09) / 1.09)
    assert c.cost.mean == pytest.approx(0.02)
    assert c.goal_met and c.goal_met_confidently
    worse = compare("s", "t", [_window(i, {"sco": 1.0, "price-only": 1.0}, {"sco": 1.2,
                    "price-only": 1.0}) for i in range(3)])  # fmt: skip
    assert not worse.comparisons[0].goal_met


def test_every_policy_warm_under_one_set_of_measures() -> None:
    regions, contracts = _estate()
    calm = {"base_rate": 0.0, "bad_rate": 0.0, "bursts_per_pool_day": 0.0,
            "bad_bursts_per_pool_day": 0.0, "region_bursts_per_day": 0.0,
            "owner_preempts": False, "hall_losses_per_region": 0}  # fmt: skip
    cfg = EstateConfig.model_validate(
        {"days": 0.5, "seed": 5, "regions": ("r1",), "tenants": 1, **calm}
    )
    quiet = simulate(list(regions.values()), contracts, cfg)
    # A warm start and nothing taken back: no policy is ever below its floors.
    assert {p.policy: p.below_floor_minutes for p in quiet.policies} == dict.fromkeys(POLICIES, 0)
    cold = simulate(
        list(regions.values()), contracts, cfg.model_copy(update={"warm_start": False}),
        ("price-only",),
    )  # fmt: skip
    assert cold.policies[0].below_floor_minutes > 0  # a cold start is what warm removes
    result = simulate(
        list(regions.values()), contracts, EstateConfig(days=0.5, seed=5, regions=("r1",),
        tenants=1),
    )  # fmt: skip
    assert [p.policy for p in result.policies] == list(POLICIES)
    for p in result.policies:
        assert p.served_unit_hours > 0 and p.cost_per_served_unit_hour > 0, p.policy
    by = {p.policy: p for p in result.policies}
    # The fair comparators fall back to committed capacity within the same authority.
    for name in ("sco", *BASELINES):
        assert by[name].fallback_minutes_over == 0, name
    runs = {r.policy: r for r in result.runs}
    assert all(runs[b].fallback for b in BASELINES)
    # The ablations: no exclusion cycle reported when it is off.
    assert runs["sco-no-exclusion"].exclusion is None and runs["sco"].exclusion is not None
    assert set(ABLATIONS) <= set(by)


def test_the_frozen_file_is_what_the_simulator_runs() -> None:
    frozen, digest = load_frozen()
    assert len(digest) == 64 and frozen.tuned_on
    cfg, defaults = config(frozen), EstateConfig()
    for key, value in frozen.sco.items():
        assert getattr(cfg, key) == value == getattr(defaults, key), key
    for scenario in frozen.scenarios.values():
        assert len(scenario.seeds or scenario.windows) >= 10


def test_a_bad_frozen_file_is_one_line(tmp_path: Path) -> None:
    doc = json.loads(FROZEN.read_text())
    doc["sco"]["exclusion_treshold"] = 4
    bad = tmp_path / "frozen.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(FrozenError, match=r"frozen.json: sco.exclusion_treshold: not a parameter"):
        load_frozen(bad)
    doc["sco"].pop("exclusion_treshold")
    doc["scenarios"]["synthetic"]["generator"] = {"exclusion_threshold": 5}
    bad.write_text(json.dumps(doc))
    with pytest.raises(
        FrozenError,
        match=r"scenarios.synthetic.generator.exclusion_threshold: one of SCO's frozen parameters",
    ):
        load_frozen(bad)
    del doc["sco"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(FrozenError, match=r"frozen.json: sco: Field required$"):
        load_frozen(bad)


def test_a_tiny_evaluation_end_to_end(tmp_path: Path) -> None:
    regions, contracts = _estate()
    doc = json.loads(FROZEN.read_text())
    doc["regions"], doc["tenants"] = ["r1"], 1
    doc["scenarios"] = {
        "synthetic": {"days": 0.25, "seeds": [1, 2]},
        "dc-sample": {
            "days": 0.25,
            "dataset": "azure_v2",
            "windows": [0, 1],
            "csv": str(DATA / "estate" / "azure_v2_sample.csv"),
        },
    }
    path = tmp_path / "frozen.json"
    path.write_text(json.dumps(doc))
    ev = evaluate(regions, contracts, path, policies=("sco", "price-only", "karpenter-pco"))
    assert [r.scenario for r in ev.scenarios] == ["synthetic", "dc-sample"]
    assert all(len(r.windows) == 2 for r in ev.scenarios)
    text = table(ev)
    assert "| sco |" in text and "vs " in text and "goal" in text and ev.frozen_sha256[:12] in text
    if importlib.util.find_spec("matplotlib") is not None:
        from workers.cli.estate_plots import write_evaluation_plots

        pngs = write_evaluation_plots(ev, tmp_path)
        assert [p.name for p in pngs] == ["eval_synthetic.png", "eval_dc-sample.png"]
        assert all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
