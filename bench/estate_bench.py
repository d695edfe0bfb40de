"""Estate benchmark: the full 30-day, three-region run of the estate simulator (estate/),
SCO's policies against price-only, Karpenter-like, SkyPilot-like and all-committed, on one
trace per seed, in the *planted* scenario (estate.config.PLANTED: the generator before
issue 34, whose headline is built into it; kept so these figures stay comparable over
time). The fair evaluation on calibrated and real traces is `sco sim evaluate`
(estate/evaluate.py, `make estate-readme`). Prints one JSON report (bench/report.py): the
issue's goals as figures beside their targets, the per-policy summary and the wall time per
policy in its details.

    .venv/bin/python bench/estate_bench.py [--days 30] [--seed 1] [--tenants 2]

The figures and the README table come from `sco sim estate` (same simulation, same seed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import Report
from contracts.region import load_regions
from contracts.source import read_contracts
from estate.config import planted
from estate.engine import LEGACY_POLICIES, simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tenants", type=int, default=2)
    args = ap.parse_args()
    regions = load_regions(ROOT / "deploy" / "regions")
    sources, _ = read_contracts(ROOT / "contracts" / "examples")
    contracts = [s.contract for s in sources]
    cfg = planted(days=args.days, seed=args.seed, tenants=args.tenants)
    # Made before the simulation, so its wall time and load samples span it.
    report = Report("estate", {"days": cfg.days, "seed": cfg.seed, "tenants": cfg.tenants})
    ordered = [regions[r] for r in sorted(regions)]
    summaries: list[dict[str, Any]] = []
    seconds: dict[str, float] = {}
    extra: dict[str, Any] = {}
    for policy in LEGACY_POLICIES:
        start = time.perf_counter()
        result = simulate(ordered, contracts, cfg, (policy,))
        seconds[policy] = round(time.perf_counter() - start, 1)
        summaries.append(result.policies[0].model_dump())
        if policy == "sco":
            extra = {
                "pools": result.pools,
                "bad_pools": result.bad_pools,
                "hall_losses": result.hall_losses,
                "excluded": {
                    r.region: {
                        "bad": r.exclusion.bad_excluded,
                        "good": r.exclusion.good_excluded,
                        "exposed_good_pools": r.exclusion.exposed_good_pools,
                    }
                    for r in result.runs
                    if r.exclusion
                },
            }
    by = {s["policy"]: s for s in summaries}
    sco, price = by["sco"], by["price-only"]
    goals = {
        "reclaims_per_1000h_vs_price_only": round(
            sco["reclaims_per_1000h"] / price["reclaims_per_1000h"] - 1, 4
        )
        if price["reclaims_per_1000h"]
        else None,
        "reclaims_30pct_fewer": sco["reclaims_per_1000h"] <= 0.7 * price["reclaims_per_1000h"],
        "fallback_never_over_authority": sco["fallback_minutes_over"] == 0,
        "floor_gaps_all_explained": sco["floor_unexplained_gap_minutes"] == 0,
        "wrongly_excluded_at_most_5pct": (sco["wrongly_excluded_share"] or 0.0) <= 0.05,
    }
    anchor = (
        f"planted scenario, {cfg.days:g} days, seed {cfg.seed}, "
        f"regions {', '.join(sorted(regions))}"
    )
    vs = goals["reclaims_per_1000h_vs_price_only"]
    if vs is None:
        report.measurement_missing(
            "reclaims_vs_price_only", "price-only saw no reclaims", "%", anchor=anchor
        )
    else:
        report.figure(
            "reclaims_vs_price_only",
            round(100 * float(vs), 1),
            "%",
            anchor=anchor + "; price-only's reclaims per 1,000 instance-hours",
            target=-30.0,
            comparator="<=",
        )
    report.figure(
        "fallback_minutes_over_authority",
        sco["fallback_minutes_over"],
        "min",
        anchor=anchor + "; each contract's spend authority",
        target=0,
        comparator="==",
    )
    report.figure(
        "floor_unexplained_gap",
        sco["floor_unexplained_gap_minutes"],
        "min",
        anchor=anchor + "; minutes short outside a rebuild window",
        target=0,
        comparator="==",
    )
    report.figure(
        "wrongly_excluded_pools",
        round(100 * (sco["wrongly_excluded_share"] or 0.0), 1),
        "%",
        anchor=anchor + "; good pools SCO used",
        target=5.0,
        comparator="<=",
    )
    report.figure(
        "simulation_seconds", round(sum(seconds.values()), 1), "s", anchor=anchor + "; all policies"
    )
    report.details.update(
        {"seconds_per_policy": seconds, "goals": goals, "policies": summaries, **extra}
    )
    raise SystemExit(report.emit())


if __name__ == "__main__":
    main()
