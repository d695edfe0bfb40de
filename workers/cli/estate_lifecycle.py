"""`sco sim lifecycle`: the capacity lifecycle in the estate simulator (issue 31), SCO's
lifecycle against SCO today and a Karpenter-like consolidation on the same trace."""

from __future__ import annotations

from pathlib import Path

import typer

from workers.cli.bounds import path_value
from workers.cli.common import console, print_json, table


def sim_lifecycle(
    days: float = typer.Option(7.0, help="Simulated days."),
    seed: int = typer.Option(1, help="Same seed, same trace, same result."),
    region: list[str] = typer.Option([], help="Regions to simulate (default: every one)."),
    tenants: int = typer.Option(1, help="Copies of each contract per region."),
    crunch_hours: float = typer.Option(
        6.0, help="Hours of each capacity crunch (no free slot in the region); 0: none."
    ),
    crunch_every_days: float = typer.Option(2.0, help="Days between crunches."),
    out: Path | None = typer.Option(
        None, help="Also write the result as JSON to this file.", parser=path_value
    ),
    regions_dir: Path = typer.Option(
        Path("deploy/regions"), help="Directory of region files.", parser=path_value
    ),
    contracts_dir: Path = typer.Option(
        Path("contracts/examples"), help="Directory of contract files.", parser=path_value
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Voluntary churn per 1,000 instance-hours, cost, savings by return from fallback and
    by consolidation, voluntary lost work and fallback spend after capacity returns:
    sco-today, sco-return, sco-lifecycle and karpenter-consolidation on one trace."""
    from estate.config import EstateConfig
    from estate.lifecycle_eval import CHURN_TARGET, FALLBACK_TARGET, evaluate_lifecycle
    from workers.cli import bounds
    from workers.cli.estate import estate_inputs

    bounds.finite("--days", days, low=0, high=366, low_open=True)
    bounds.whole("--seed", seed, low=0, high=2**32 - 1)
    bounds.whole("--tenants", tenants, low=1, high=100)
    bounds.finite("--crunch-hours", crunch_hours, low=0, high=24 * 366)
    bounds.finite("--crunch-every-days", crunch_every_days, low=0, high=366, low_open=True)
    bounds.in_dir("--regions-dir", regions_dir)
    bounds.in_dir("--contracts-dir", contracts_dir)
    if out is not None:
        bounds.out_dir("--out", out.parent)
    regions, sources = estate_inputs(regions_dir, contracts_dir, region)
    cfg = EstateConfig(days=days, seed=seed, tenants=tenants, regions=tuple(region))
    result = evaluate_lifecycle(
        [regions[r] for r in sorted(regions)],
        [s.contract for s in sources],
        cfg,
        crunch_hours=crunch_hours,
        crunch_every_days=crunch_every_days,
    )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(result.model_dump_json(indent=1) + "\n")
    if json_out:
        print_json(result.model_dump(mode="json"))
        return
    table(
        f"capacity lifecycle, {days:g} days, regions {', '.join(result.regions)}, "
        f"{len(result.crunches)} crunch(es)",
        [
            "policy",
            "cost",
            "fallback",
            "fallback, capacity back",
            "disruptions",
            "churn /1000 h",
            "lost unit-h",
        ],
        [
            (
                p.policy,
                f"{p.cost:.2f}",
                f"{p.fallback_cost:.2f}",
                f"{p.fallback_cost_capacity_back:.2f}",
                ", ".join(f"{k} {v}" for k, v in p.disruptions_by_reason.items()) or "0",
                f"{p.churn_per_1000h:g}",
                f"{p.voluntary_lost_unit_hours:g}",
            )
            for p in result.policies
        ],
    )

    def verdict(ok: bool) -> str:
        return "[green]met[/]" if ok else "[red]missed[/]"

    console.print(
        f"saved by return from fallback: {result.saved_by_return_from_fallback:.2f}; "
        f"by consolidation: {result.saved_by_consolidation:.2f}"
    )
    console.print(
        f"churn vs Karpenter-like: {result.churn_vs_baseline} (target <= {CHURN_TARGET:.3f}), "
        f"cost vs Karpenter-like: {result.cost_vs_baseline} (target <= 1): "
        + verdict(result.churn_target_met)
    )
    console.print(
        f"fallback spend after capacity returns vs today: "
        f"{result.fallback_after_return_vs_today} (target <= {FALLBACK_TARGET}): "
        + verdict(result.fallback_target_met)
    )
    if out is not None:
        console.print(f"wrote {out}")
