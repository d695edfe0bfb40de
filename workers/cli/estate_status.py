"""`sco estate status`: every region at a glance (workers/estate_view.py). Not the estate
simulator, which is `sco sim estate`."""

from __future__ import annotations

import typer

from workers.cli import bounds
from workers.cli.common import console, known_region, print_json, settings, table

estate_app = typer.Typer(
    help="The estate across regions: floors, reclaimable capacity, exclusions, "
    "acquisitions, approvals and spend, per region and hall.",
    no_args_is_help=True,
)


@estate_app.command("status")
def estate_status(
    region: list[str] = typer.Option(
        None, "--region", help="Only these regions (repeatable); default: every region."
    ),
    deadline: float = typer.Option(
        None,
        "--deadline",
        min=0.1,
        help="Seconds each region has to answer (default: estate.deadline_seconds).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The estate at a glance, per region and hall.

    Floors held/target, reclaimable instances, excluded pools, open acquisitions and
    approvals waiting, spend per hour. Each region is read from its own
    fleet state and Temporal namespace within the deadline; a region that does not answer
    is shown as such and the rest still print. Exit 1 when a region did not answer."""
    from workers.estate_view import read_estate

    if deadline is not None:
        bounds.finite("--deadline", deadline, low=0.1, high=300)
    s = settings()
    if deadline is not None:
        s = s.model_copy(
            update={"estate": s.estate.model_copy(update={"deadline_seconds": deadline})}
        )
    regions = [known_region(s, r) for r in region] if region else None
    view = read_estate(s, regions)
    if json_out:
        print_json(view.model_dump(mode="json"))
    else:
        rows: list[list[object]] = []
        for r in view.regions:
            if not r.answered:
                down: list[object] = [r.region, "-", f"[red]not answering[/]: {r.error}"]
                rows.append(down + [""] * 6)
                continue
            for h in r.halls:
                rows.append(
                    [
                        r.region,
                        h.hall,
                        f"{h.floor_held_units}/{h.floor_target_units}",
                        h.reclaimable_instances,
                        h.committed_instances,
                        ", ".join(h.excluded_pools) or "-",
                        h.open_acquisitions,
                        h.approvals_waiting,
                        f"{h.spend_per_hour:.2f} {r.currency}",
                    ]
                )
        table(
            "SCO estate",
            [
                "region",
                "hall",
                "floor held/target",
                "reclaimable",
                "committed",
                "excluded pools",
                "open acq.",
                "approvals",
                "spend/h",
            ],
            rows,
        )
        for r in view.regions:
            if not r.answered:
                continue
            floors = "; ".join(
                f"{f.contract} {f.state} {f.held_units}/{f.floor_units}"
                + (f" lost {','.join(f.lost_halls)}" if f.lost_halls else "")
                for f in r.floors
            )
            extra = f" [yellow]partial: {'; '.join(r.partial)}[/]" if r.partial else ""
            console.print(
                f"{r.region}: {r.open_acquisitions} open acquisitions, "
                f"{r.approvals_waiting} waiting approval, {r.spend_per_hour:.2f} "
                f"{r.currency}/h; floors: {floors or 'none'}{extra}"
            )
    if any(not r.answered for r in view.regions):
        raise typer.Exit(1)
