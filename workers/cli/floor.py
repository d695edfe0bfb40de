"""`sco hall lost|restored` and `sco floor start|status`: the floor keepers of a region."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import typer

from workers.cli import audit
from workers.cli.common import (
    console,
    fail,
    known_region,
    print_json,
    print_workflow_link,
    print_workflow_urls,
    region_or_exit,
    run_temporal,
    settings,
    table,
    temporal_client,
    workflow_url,
)
from workers.settings import Settings

if TYPE_CHECKING:
    from workflows.floor.models import FloorStatus, HallEvent

T = TypeVar("T")

hall_app = typer.Typer(
    help="Declare a hall lost or restored to the floor keepers.", no_args_is_help=True
)
floor_app = typer.Typer(help="Committed floors of tier-1 contracts.", no_args_is_help=True)

RegionOpt = typer.Option(None, "--region", help="Region; default from settings.")


def _keepers_query(region: str) -> str:
    from workflows import search_attributes as sa

    return (
        f'WorkflowType = "FloorKeeperWorkflow" AND {sa.REGION.name} = "{region}" '
        'AND ExecutionStatus = "Running"'
    )


async def _tell_keepers(s: Settings, region: str, signal: str, event: HallEvent) -> list[str]:
    client = await temporal_client(s, region)
    told = []
    async for wf in client.list_workflows(_keepers_query(region)):
        await client.get_workflow_handle(wf.id).signal(signal, event)
        told.append(wf.id)
    return told


def _hall_command(signal: str, verb: str) -> Any:
    def command(
        region: str = typer.Argument(..., help="Region, e.g. r1."),
        hall: str = typer.Argument(..., help="Hall (availability zone), e.g. B."),
        by: str = typer.Option(..., "--by", help="Who says so (recorded as a decision)."),
        reason: str = typer.Option(..., "--reason", help="Why (recorded as a decision)."),
    ) -> None:
        from workflows.floor.models import HallEvent

        s = settings()
        known_region(s, region)
        halls = region_or_exit(s, region).halls
        if hall not in halls:
            fail(f"region {region} has no hall {hall} (halls: {', '.join(halls)})")
        event = HallEvent(hall=hall, operator=by, reason=reason, identity=audit.identity(s))
        told = run_temporal(_tell_keepers(s, region, signal, event))
        if not told:
            console.print(
                f"[yellow]no floor keeper is running in {region}[/]: start them with "
                f"`sco floor start --region {region}`"
            )
            return
        console.print(f"hall {hall} in {region} {verb}: told {len(told)} floor keeper(s)")
        print_workflow_urls(s, region, told)

    command.__doc__ = {
        "hall_lost": "Hall lost: every floor keeper of the region rebuilds its share elsewhere.",
        "hall_restored": "Hall back: every floor keeper rebalances toward it, make-before-break.",
    }[signal]
    return command


hall_app.command("lost")(_hall_command("hall_lost", "declared lost"))
hall_app.command("restored")(_hall_command("hall_restored", "declared restored"))


@floor_app.command("start")
def floor_start(region: str = RegionOpt) -> None:
    """Start one floor keeper per tier-1 contract with a floor in the region (idempotent)."""
    from contracts.cache import installed_bundle
    from workers.region_worker import ensure_floor_keepers

    s = settings()
    r = known_region(s, region)
    bundle, problem = installed_bundle(s.bundle_cache_dir, s.trust_dir)
    if bundle is None:
        fail(problem)

    async def go() -> list[str]:
        return await ensure_floor_keepers(await temporal_client(s, r), s, r)

    ids = run_temporal(go())
    if not ids:
        console.print(f"no tier-1 contract has a floor in {r} (bundle serial {bundle.serial})")
    for wid in ids:
        console.print(f"running: {wid}")
        print_workflow_link(s, r, wid)


@floor_app.command("status")
def floor_status(region: str = RegionOpt, json_out: bool = typer.Option(False, "--json")) -> None:
    """Each floor keeper: floor, units held per hall, lost halls, state and why."""
    from temporalio.service import RPCError

    from activities.floor.models import floor_workflow_id
    from workflows.floor.models import FloorStatus

    s = settings()
    r = known_region(s, region)

    async def go() -> list[FloorStatus | str]:
        client = await temporal_client(s, r)
        out: list[FloorStatus | str] = []
        async for wf in client.list_workflows(_keepers_query(r)):
            try:
                st: FloorStatus = await client.get_workflow_handle(wf.id).query(
                    "status", result_type=FloorStatus
                )
                out.append(st)
            except RPCError as exc:
                out.append(f"{wf.id}: {exc.message}")
        return out

    rows = run_temporal(go())
    if json_out:
        print_json(
            [
                {
                    **x.model_dump(mode="json"),
                    "ui_url": workflow_url(s, r, floor_workflow_id(x.region, x.contract)),
                }
                if isinstance(x, FloorStatus)
                else x
                for x in rows
            ]
        )
        return
    lines: list[tuple[object, ...]] = []
    for x in rows:
        if isinstance(x, str):
            lines.append((x, "", "", "", "", "", ""))
            continue
        held = sum(x.held_units_by_hall.values())
        lines.append(
            (
                x.contract,
                f"{held}/{x.floor_units}",
                " ".join(f"{h}={u}" for h, u in x.held_units_by_hall.items()),
                ",".join(x.lost_halls),
                x.state.value,
                "" if x.last_rebuild_seconds is None else f"{x.last_rebuild_seconds:.0f} s",
                x.reason,
            )
        )
    table(
        f"floors in {r}",
        ["contract", "held/floor", "by hall", "lost", "state", "last rebuild", "reason"],
        lines,
    )
    print_workflow_urls(
        s,
        r,
        [floor_workflow_id(x.region, x.contract) for x in rows if isinstance(x, FloorStatus)],
    )
