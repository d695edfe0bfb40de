"""Capacity lifecycle bench (issue 31): the estate simulator runs SCO's lifecycle (return
from fallback and consolidation by planning/lifecycle.plan_lifecycle, the workflow's pure
code) against SCO today (no return from fallback) and a Karpenter-like consolidation
(WhenEmptyOrUnderutilized, consolidateAfter 0, no budgets), on one trace per region with
capacity crunches laid over it (estate/lifecycle_eval.py). Prints one JSON report
(bench/report.py): churn against the baseline's, cost against the baseline's, fallback
spend after capacity returns against today's, the savings and the voluntary lost work.

    .venv/bin/python bench/lifecycle_bench.py [--days 7] [--seed 1] [--tenants 1]
        [--region r1 ...] [--tiny]

The same figures: `sco sim lifecycle`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import Report
from contracts.region import load_regions
from contracts.source import read_contracts
from estate.config import EstateConfig
from estate.lifecycle_eval import CHURN_TARGET, FALLBACK_TARGET, evaluate_lifecycle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tenants", type=int, default=1)
    ap.add_argument("--region", action="append", default=[])
    ap.add_argument("--crunch-hours", type=float, default=6.0)
    ap.add_argument("--crunch-every-days", type=float, default=2.0)
    ap.add_argument(
        "--tiny", action="store_true", help="18 hours of r1, one 3-hour crunch (a minute)."
    )
    args = ap.parse_args()
    days, picked = (0.75, ["r1"]) if args.tiny else (args.days, args.region)
    if args.tiny:
        args.crunch_hours = 3.0
    regions = load_regions(ROOT / "deploy" / "regions")
    sources, _ = read_contracts(ROOT / "contracts" / "examples")
    cfg = EstateConfig(days=days, seed=args.seed, tenants=args.tenants, regions=tuple(picked))
    report = Report(
        "lifecycle",
        {
            "days": cfg.days,
            "seed": cfg.seed,
            "tenants": cfg.tenants,
            "regions": list(cfg.regions) or "all",
            "crunch_hours": args.crunch_hours,
            "crunch_every_days": args.crunch_every_days,
        },
    )
    start = time.perf_counter()
    result = evaluate_lifecycle(
        [regions[r] for r in sorted(regions)],
        [s.contract for s in sources],
        cfg,
        crunch_hours=args.crunch_hours,
        crunch_every_days=args.crunch_every_days,
    )
    seconds = round(time.perf_counter() - start, 1)
    anchor = (
        f"calibrated estate, {cfg.days:g} days, seed {cfg.seed}, regions "
        f"{', '.join(result.regions)}, {len(result.crunches)} crunch(es) of "
        f"{args.crunch_hours:g} h"
    )
    sco, base = result.policy("sco-lifecycle"), result.policy("karpenter-consolidation")
    today = result.policy("sco-today")
    if result.churn_vs_baseline is None:
        report.measurement_missing(
            "churn_vs_karpenter", "the baseline disrupted nothing", "x", anchor=anchor
        )
    else:
        report.figure(
            "churn_vs_karpenter",
            result.churn_vs_baseline,
            "x",
            anchor=anchor
            + f"; voluntary disruptions per 1,000 instance-hours, SCO {sco.churn_per_1000h:g}"
            f" vs Karpenter-like {base.churn_per_1000h:g}",
            target=round(CHURN_TARGET, 4),
            comparator="<=",
        )
    report.figure(
        "cost_vs_karpenter",
        result.cost_vs_baseline,
        "x",
        anchor=anchor + f"; SCO {sco.cost:g} vs Karpenter-like {base.cost:g}",
        target=1.0,
        comparator="<=",
    )
    if result.fallback_after_return_vs_today is None:
        report.measurement_missing(
            "fallback_after_return_vs_today",
            "today's policy ran no fallback while capacity was back",
            "x",
            anchor=anchor,
        )
    else:
        report.figure(
            "fallback_after_return_vs_today",
            result.fallback_after_return_vs_today,
            "x",
            anchor=anchor + f"; fallback spend while reclaimable capacity was back, SCO "
            f"{sco.fallback_cost_capacity_back:g} vs today {today.fallback_cost_capacity_back:g}",
            target=FALLBACK_TARGET,
            comparator="<=",
        )
    # Consolidation's share of the churn apart: what peers' users complain of (issue 31),
    # shown beside the total, which also counts SCO's many more returns from fallback.
    sco_c, base_c = (p.disruptions_by_reason.get("consolidation", 0) for p in (sco, base))
    report.figure(
        "consolidation_churn_vs_karpenter",
        round(sco_c / base_c, 4) if base_c else 0.0,
        "x",
        anchor=anchor + f"; consolidations, SCO {sco_c} vs Karpenter-like {base_c}",
    )
    report.figure(
        "saved_by_return_from_fallback",
        result.saved_by_return_from_fallback,
        "money",
        anchor=anchor + "; cost of sco-today less sco-return, same trace",
    )
    report.figure(
        "saved_by_consolidation",
        result.saved_by_consolidation,
        "money",
        anchor=anchor + "; cost of sco-return less sco-lifecycle, same trace",
    )
    report.figure(
        "voluntary_lost_unit_hours",
        sco.voluntary_lost_unit_hours,
        "unit-h",
        anchor=anchor + f"; Karpenter-like {base.voluntary_lost_unit_hours:g}",
    )
    report.figure("simulation_seconds", seconds, "s", anchor=anchor + "; four policies")
    report.details.update(result.model_dump())
    raise SystemExit(report.emit())


if __name__ == "__main__":
    main()
