"""The capacity lifecycle in the estate simulator (estate/lifecycle_sim.py): on 18 hours of
one region with a 3-hour capacity crunch, today's SCO keeps its fallback after capacity
returns, the lifecycle returns from it (planning/lifecycle.plan_lifecycle, the workflow's
code), and a Karpenter-like consolidation churns more than SCO's. Plus `sco sim lifecycle`."""

from __future__ import annotations

import json
from functools import cache

import pytest
from typer.testing import CliRunner

from contracts.region import load_regions
from contracts.source import read_contracts
from estate.config import EstateConfig
from estate.lifecycle_eval import FALLBACK_TARGET, LifecycleResult, crunches, evaluate_lifecycle
from estate.lifecycle_sim import ScoLifecycle
from planning.lifecycle import AntiChurn
from tests.support.paths import EXAMPLES, REGIONS_DIR
from workers.cli.main import app
from workers.settings import LifecycleSettings
from workflows.lifecycle.models import LifecycleConfig

pytestmark = pytest.mark.timeout(300)


@cache
def _result() -> LifecycleResult:
    regions = load_regions(REGIONS_DIR)
    contracts = [s.contract for s in read_contracts(EXAMPLES)[0]]
    cfg = EstateConfig(days=0.75, seed=1, tenants=1, regions=("r1",))
    return evaluate_lifecycle(
        [regions[r] for r in sorted(regions)], contracts, cfg, crunch_hours=3.0
    )


def test_the_crunch_windows() -> None:
    cfg = EstateConfig(days=5, regions=("r1",))
    assert crunches(cfg, 6, 2) == [(600, 960), (3480, 3840), (6360, 6720)]
    assert crunches(cfg, 0, 2) == []
    assert crunches(EstateConfig(days=0.5), 6, 2) == [(600, 720)]


def test_today_keeps_fallback_the_lifecycle_returns_from_it() -> None:
    r = _result()
    today, ret, sco = (r.policy(n) for n in ("sco-today", "sco-return", "sco-lifecycle"))
    assert today.fallback_cost > 0, "the crunch made nobody fall back"
    assert today.voluntary_disruptions == 0
    assert set(ret.disruptions_by_reason) == {"return-from-fallback"}
    assert ret.fallback_cost_capacity_back < today.fallback_cost_capacity_back
    assert r.saved_by_return_from_fallback > 0
    # llm-train's gpu-a.2xl fallback, with only l/xl free, returns as smaller instances
    # (decision 0031): on this trace what runs on after capacity returns is under 10 %
    # of today's (one-for-one replacement left 73 %).
    assert r.fallback_after_return_vs_today is not None
    assert r.fallback_after_return_vs_today <= FALLBACK_TARGET
    assert sco.fallback_cost_capacity_back <= ret.fallback_cost_capacity_back + 1e-6


def test_the_karpenter_like_baseline_churns_more() -> None:
    r = _result()
    sco, base = r.policy("sco-lifecycle"), r.policy("karpenter-consolidation")
    assert base.voluntary_disruptions > sco.voluntary_disruptions
    assert r.churn_vs_baseline is not None and r.churn_vs_baseline < 1
    assert base.voluntary_lost_unit_hours >= sco.voluntary_lost_unit_hours


def test_same_seed_same_result() -> None:
    regions = load_regions(REGIONS_DIR)
    contracts = [s.contract for s in read_contracts(EXAMPLES)[0]]
    cfg = EstateConfig(days=0.2, seed=3, tenants=1, regions=("r1",))
    ordered = [regions[r] for r in sorted(regions)]
    a = evaluate_lifecycle(ordered, contracts, cfg, crunch_hours=0)
    assert a == evaluate_lifecycle(ordered, contracts, cfg, crunch_hours=0)
    assert a.crunches == []


def test_sim_lifecycle_command() -> None:
    runner = CliRunner()
    out = runner.invoke(
        app,
        ["sim", "lifecycle", "--days", "0.46", "--region", "r1", "--crunch-hours", "1", "--json"],
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert [p["policy"] for p in doc["policies"]] == [
        "sco-today",
        "sco-return",
        "sco-lifecycle",
        "karpenter-consolidation",
    ]
    assert doc["crunches"] == [[600, 660]]
    bad = runner.invoke(app, ["sim", "lifecycle", "--region", "r9"])
    assert bad.exit_code != 0 and "--region: unknown" in bad.output
    assert len(bad.output.strip().splitlines()) == 1


def test_the_sim_runs_the_workflows_default_anti_churn() -> None:
    """SCO's policies in the sim take AntiChurn's defaults: the workflow's and the
    settings' (max_return_parts included) must be the same, or the bench measures
    another product."""
    sim = ScoLifecycle.anti_churn
    for knobs in (LifecycleConfig(), LifecycleSettings()):
        assert {k: getattr(knobs, k) for k in AntiChurn.model_fields} == sim.model_dump()
