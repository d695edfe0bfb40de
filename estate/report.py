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
            if p.policy != "all-committed"
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
    rows.append("")
    rows.append(fair_table(result))
    losses = "; ".join(
        f"{r}: hall {h} minutes {s}-{e}" for r, hs in result.hall_losses.items() for h, s, e in hs
    )
    bad = ", ".join(p for ps in result.bad_pools.values() for p in ps)
    rows.append("")
    rows.append(
        f"{result.days:g} days, seed {result.seed}, regions {', '.join(result.regions)} "
        f"({result.pools} pools), {result.tenants} tenant(s) per contract. "
        f"Bad pools: {bad or 'none'}. "
        f"Hall losses: {losses or 'none'}."
    )
    return "\n".join(rows)


def fair_table(result: EstateResult) -> str:
    """Every policy under the one set of measures (issue 34), against the best of the fair
    baselines that ran (lowest work lost per 1,000 useful unit-hours)."""
    from estate.engine import BASELINES

    ran = {p.policy: p for p in result.policies}
    fair = [ran[b] for b in BASELINES if b in ran]
    best = min(fair, key=lambda p: (p.work_lost_per_1000_unit_hours, p.policy), default=None)
    head = (
        "| policy | cost / served unit-h | unserved unit-h | p99 time to capacity (min) "
        "| work lost / 1,000 useful unit-h"
        + (f" (vs {best.policy})" if best else "")
        + " | minutes below floor | fallback refused (unit-steps) | voluntary releases |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    rows = [head]
    for p in result.policies:
        vs = ""
        if best and p.policy != best.policy and best.work_lost_per_1000_unit_hours:
            ratio = p.work_lost_per_1000_unit_hours / best.work_lost_per_1000_unit_hours
            vs = f" ({ratio - 1:+.0%})"
        rows.append(
            f"| {p.policy} | {p.cost_per_served_unit_hour:.4f} | {p.unserved_unit_hours:,.0f} "
            f"| {p.p99_time_to_capacity_minutes:.0f} | {p.work_lost_per_1000_unit_hours:.3f}{vs} "
            f"| {p.below_floor_minutes} | {p.fallback_refused_units:,} | {p.voluntary_releases:,} |"
        )
    return "\n".join(rows)
