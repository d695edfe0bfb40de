"""PNG figures of an estate run (matplotlib, Agg backend: no display needed).

Imported only by `sco sim estate` when it runs: matplotlib is the optional `plots` extra.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from contracts.pool_id import PoolId
from estate.evaluate import Evaluation
from estate.results import EstateResult, RegionRun

SKUS = ("gp", "cpu", "mem", "hmem", "stor", "gpu-a", "gpu-l", "bm-cpu", "bm-gpu")
SIZES = ("l", "xl", "2xl", "4xl")


def write_plots(result: EstateResult, out: Path) -> list[Path]:
    """cost.png, reclaims_heatmap.png, floor_halls.png (when a floor saw a hall loss) and
    exclusions.png in ``out``."""
    written = []

    # Cost over time per policy (the estate's cumulative spend).
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for policy in result.policies:
        runs = [r for r in result.runs if r.policy == policy.policy]
        hours = min(len(r.hourly_cost) for r in runs)
        total = [sum(r.hourly_cost[h] for r in runs) for h in range(hours)]
        ax.plot([h / 24 for h in range(hours)], total, label=policy.policy)
    ax.set_xlabel("day")
    ax.set_ylabel("cumulative spend (EUR)")
    ax.set_title(f"Estate spend, {', '.join(result.regions)}, seed {result.seed}")
    ax.legend()
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "cost.png"))

    # Reclaims per pool, per hall, for price-only and SCO in the first region.
    region = result.regions[0]
    shown = [r for r in result.runs if r.region == region and r.policy in ("price-only", "sco")]
    fig, axes = plt.subplots(len(shown), 4, figsize=(12, 3.2 * len(shown)), squeeze=False)
    top = max((max(r.pool_reclaims.values(), default=0) for r in shown), default=1) or 1
    image = None
    for row, run in enumerate(shown):
        for col, hall in enumerate(("A", "B", "C", "D")):
            grid = [
                [run.pool_reclaims.get(str(PoolId(region, hall, sku, size)), 0) for size in SIZES]
                for sku in SKUS
            ]
            ax = axes[row][col]
            image = ax.imshow(grid, cmap="Reds", vmin=0, vmax=top, aspect="auto")
            ax.set_xticks(range(len(SIZES)), SIZES)
            ax.set_yticks(range(len(SKUS)), SKUS if col == 0 else [""] * len(SKUS))
            ax.set_title(f"{run.policy}: hall {hall}")
    if image is not None:
        fig.colorbar(image, ax=axes, label="reclaims of our instances")
    written.append(_save(fig, out / "reclaims_heatmap.png"))

    # Floor units per hall through the first hall loss (SCO).
    sco = next((r for r in result.runs if r.policy == "sco" and r.floor_trace), None)
    if sco is not None:
        fig, ax = plt.subplots(figsize=(8, 4))
        end = max(m for points in sco.floor_trace.values() for m, _ in points)
        # Halls often hold the same share: different dashes keep overlapping lines visible.
        styles = ["-", "--", "-.", ":"]
        for n, (hall, points) in enumerate(sorted(sco.floor_trace.items())):
            xs = [m for m, _ in points] + [end]
            ys = [u for _, u in points] + [points[-1][1]]
            ax.step(
                xs,
                ys,
                where="post",
                label=f"hall {hall}",
                linestyle=styles[n % 4],
                linewidth=2.5 - 0.4 * n,
            )
        for hall, start, stop in result.hall_losses.get(sco.region, []):
            ax.axvspan(start, stop, color="grey", alpha=0.2, label=f"hall {hall} lost")
        ax.set_xlabel("minute")
        ax.set_ylabel("floor units up")
        ax.set_title(f"{sco.floor_trace_contract} floor in {sco.region} through a hall loss")
        ax.legend()
        written.append(_save(fig, out / "floor_halls.png"))

    # Exclusion timeline of the bad pools (SCO).
    written.append(_exclusions(result, out / "exclusions.png"))
    return written


def _exclusions(result: EstateResult, path: Path) -> Path:
    runs: list[RegionRun] = [r for r in result.runs if r.policy == "sco" and r.exclusion]
    lanes = [(pool, tl) for r in runs if r.exclusion for pool, tl in r.exclusion.timelines.items()]
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * max(1, len(lanes))))
    end = result.days * 1440
    colours = {"excluded": "tab:red", "probing": "tab:orange"}
    for y, (_, timeline) in enumerate(lanes):
        if not timeline:
            continue
        ends = [m for m, _ in timeline[1:]] + [end]
        for (start, state), stop in zip(timeline, ends, strict=True):
            if state in colours:
                ax.broken_barh(
                    [(start / 1440, (stop - start) / 1440)], (y - 0.4, 0.8), color=colours[state]
                )
    ax.set_yticks(range(len(lanes)), [p for p, _ in lanes])
    ax.set_xlim(0, result.days)
    ax.set_xlabel("day (red: excluded, orange: canary probe)")
    ax.set_title("Exclusion cycle on the bad pools (SCO)")
    return _save(fig, path)


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def write_evaluation_plots(ev: Evaluation, out: Path) -> list[Path]:
    """eval_<scenario>.png: per policy, work lost per 1,000 useful unit-hours and cost per
    served unit-hour, means with their 95 % intervals."""
    written = []
    for r in ev.scenarios:
        policies = list(r.summary)
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
        for ax, metric, label in (
            (axes[0], "work_lost_per_1000_unit_hours", "work lost / 1,000 useful unit-h"),
            (axes[1], "cost_per_served_unit_hour", "cost / served unit-h (EUR)"),
            (axes[2], "below_floor_minutes", "tier-1 minutes below floor"),
        ):
            means = [r.summary[p][metric].mean for p in policies]
            errs = [
                r.summary[p][metric].mean - r.summary[p][metric].low
                if math.isfinite(r.summary[p][metric].low)
                else 0.0
                for p in policies
            ]
            colors = [
                "tab:green"
                if p == "sco"
                else "tab:olive"
                if p.startswith("sco-")
                else "tab:red"
                if p == r.best_baseline
                else "tab:gray"
                for p in policies
            ]
            ax.barh(policies, means, xerr=errs, color=colors, capsize=3)
            ax.invert_yaxis()
            ax.set_xlabel(label)
            ax.grid(alpha=0.3, axis="x")
        fig.suptitle(
            f"{r.scenario}: {len(r.windows)} paired windows, mean and 95 % CI "
            f"(red: best baseline {r.best_baseline})"
        )
        fig.tight_layout()
        written.append(_save(fig, out / f"eval_{r.scenario}.png"))
    return written
