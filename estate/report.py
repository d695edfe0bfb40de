"""The comparison table of a run, as Markdown (README and the CLI print the same text)."""

from __future__ import annotations

from estate.results import EstateResult, PolicySummary


def _pct_fewer(p: PolicySummary, base: PolicySummary) -> str:
    if not base.reclaims_per_1000h or p.policy == base.policy or not p.reclaimable_instance_hours:
        return ""
    return f" ({p.reclaims_per_1000h / base.reclaims_per_1000h - 1:+.0%})"


def table(result: EstateResult) -> str:
    base = next((p for p in result.policies if p.policy == "price-only"), None)
    head = (
        "| policy | cost | unserved unit-h | reclaims / 1,000 inst-h (vs price-only) | "
        "CI min lost / reclaim | "
        "Spark min lost / reclaim | training steps lost / reclaim (on notice / periodic) | "
        "tier-1 floor availability (unexplained gap min) | fallback max / authority | "
        "good pools excluded (share of excluded time) |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    rows = [head]
    for p in result.policies:
        lost = p.lost_minutes_per_reclaim
        vs = _pct_fewer(p, base) if base else ""
        fallback = (
            f"{p.fallback_max_share_of_authority:.0%}, {p.fallback_minutes_over} min over"
            if p.policy == "sco"
            else "n/a"
        )
        wrong = (
            "n/a"
            if p.wrongly_excluded_share is None
            else f"{p.wrongly_excluded_share:.1%} ({p.good_excluded_time_share or 0.0:.1%})"
        )
        rows.append(
            f"| {p.policy} | {p.cost:,.0f} | {p.short_unit_hours:,.0f} | "
            f"{p.reclaims_per_1000h:.2f}{vs} | "
            f"{lost['ci']:.1f} | {lost['spark']:.2f} | "
            f"{p.training_steps_per_reclaim:,.0f} / {p.training_steps_per_reclaim_periodic:,.0f} | "
            f"{p.floor_availability:.4%} ({p.floor_unexplained_gap_minutes}) | "
            f"{fallback} | {wrong} |"
        )
    losses = "; ".join(
        f"{r}: hall {h} minutes {s}-{e}" for r, hs in result.hall_losses.items() for h, s, e in hs
    )
    bad = ", ".join(p for ps in result.bad_pools.values() for p in ps)
    rows.append("")
    rows.append(
        f"{result.days:g} days, seed {result.seed}, regions {', '.join(result.regions)} "
        f"({result.pools} pools), {result.tenants} tenant(s) per contract. Bad pools: {bad}. "
        f"Hall losses: {losses or 'none'}."
    )
    return "\n".join(rows)
