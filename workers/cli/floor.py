"""`sco hall lost|restored` and `sco floor start|status|reset`: the floor keepers of a region."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from workers.cli import audit, bounds
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
    start_region_workflows,
    table,
    temporal_client,
    worker_runs,
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
JsonOpt = typer.Option(False, "--json", help="The answer as JSON (its schema: docs/reference.md).")


def _keepers_query(region: str) -> str:
    from workflows import search_attributes as sa

    return (
        f'WorkflowType = "FloorKeeperWorkflow" AND {sa.REGION.name} = "{region}" '
        'AND ExecutionStatus = "Running"'
    )


async def _tell_keepers(
    s: Settings, region: str, signal: str, event: HallEvent
) -> tuple[list[str], bool]:
    """The keepers told (a durable signal each), and whether a worker runs to act on it."""
    client = await temporal_client(s, region)
    keepers = [wf.id async for wf in client.list_workflows(_keepers_query(region))]
    for wid in keepers:
        await client.get_workflow_handle(wid).signal(signal, event)
    return keepers, await worker_runs(client, region) if keepers else True


def _hall_command(lost: bool, verb: str) -> Any:
    def command(
        region: str = typer.Argument(..., help="Region, e.g. r1."),
        hall: str = typer.Argument(..., help="Hall (availability zone), e.g. B."),
        by: str = typer.Option(..., "--by", help="Who says so (recorded as a decision)."),
        reason: str = typer.Option(..., "--reason", help="Why (recorded as a decision)."),
        json_out: bool = JsonOpt,
    ) -> None:
        from workflows.floor.models import HALL_LOST_SIGNAL, HALL_RESTORED_SIGNAL, HallEvent

        signal = HALL_LOST_SIGNAL if lost else HALL_RESTORED_SIGNAL

        s = settings()
        known_region(s, region)
        halls = region_or_exit(s, region).halls
        if hall not in halls:
            fail(f"region {region} has no hall {hall} (halls: {', '.join(halls)})")
        by = bounds.text("--by", by, max_len=bounds.MAX_ID)
        reason = bounds.text("--reason", reason)
        event = HallEvent(hall=hall, operator=by, reason=reason, identity=audit.identity(s))
        told, worker = run_temporal(_tell_keepers(s, region, signal, event))
        if json_out:
            print_json(
                {
                    "region": region,
                    "hall": hall,
                    "event": "lost" if lost else "restored",
                    "told": [
                        {"workflow_id": w, "ui_url": workflow_url(s, region, w)} for w in told
                    ],
                    "worker_running": worker,
                }
            )
            return
        if told and not worker:
            console.print(
                f"[yellow]note:[/] no worker polls {region}'s task queue: the keepers act on "
                f"it when the {region} worker runs"
            )
        if not told:
            console.print(
                f"[yellow]no floor keeper is running in {region}[/]: start them with "
                f"`sco floor start --region {region}`"
            )
            return
        console.print(f"hall {hall} in {region} {verb}: told {len(told)} floor keeper(s)")
        print_workflow_urls(s, region, told)

    command.__doc__ = (
        "Hall lost: every floor keeper of the region rebuilds its share elsewhere."
        if lost
        else "Hall back: every floor keeper rebalances toward it, make-before-break."
    )
    return command


hall_app.command("lost")(_hall_command(True, "declared lost"))
hall_app.command("restored")(_hall_command(False, "declared restored"))


@floor_app.command("start")
def floor_start(region: str = RegionOpt, json_out: bool = JsonOpt) -> None:
    """Start one floor keeper per tier-1 contract with a floor in the region (idempotent);
    refused when no worker polls the region's task queue (they would wait for one)."""
    from contracts.bundle import installed_bundle
    from services.region_worker.service import ensure_floor_keepers

    s = settings()
    r = known_region(s, region)
    bundle, problem = installed_bundle(s.bundle_cache_dir, s.trust_dir)
    if bundle is None:
        fail(problem)

    start_region_workflows(
        s,
        r,
        ensure_floor_keepers,
        json_out=json_out,
        none_running=f"no tier-1 contract has a floor in {r} (bundle serial {bundle.serial})",
    )


@floor_app.command("status")
def floor_status(region: str = RegionOpt, json_out: bool = typer.Option(False, "--json")) -> None:
    """Each floor keeper: floor, units held per hall, lost halls, state and why."""
    from temporalio.service import RPCError

    from activities.floor.models import floor_workflow_id
    from workflows.floor.models import STATUS_QUERY, FloorStatus

    s = settings()
    r = known_region(s, region)

    async def go() -> list[FloorStatus | str]:
        client = await temporal_client(s, r)
        out: list[FloorStatus | str] = []
        async for wf in client.list_workflows(_keepers_query(r)):
            try:
                st: FloorStatus = await client.get_workflow_handle(wf.id).query(
                    STATUS_QUERY, result_type=FloorStatus, rpc_timeout=timedelta(seconds=3)
                )
                out.append(st)
            except RPCError as exc:  # a failing workflow task answers no query: wedged
                contract = wf.id.removeprefix(f"floor-{r}-")
                out.append(
                    f"{wf.id}: not answering ({exc.message}); recover with "
                    f"`sco floor reset {contract} --region {r} --by <you> --reason <why>`"
                )
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


@floor_app.command("reset")
def floor_reset(
    contract: str = typer.Argument(..., help="The keeper's contract, e.g. llm-train."),
    region: str = RegionOpt,
    by: str = typer.Option(..., "--by", help="Who resets it (recorded as the reset reason)."),
    reason: str = typer.Option(..., "--reason", help="Why (recorded as the reset reason)."),
    event_id: int | None = typer.Option(
        None, "--event-id", help="Reset to this WorkflowTaskStarted event instead of the found one."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say where, reset nothing."),
    json_out: bool = JsonOpt,
) -> None:
    """A floor keeper that answers no query: replay its history with this code, reset it to
    the last workflow task before the one that fails (`temporal workflow reset`)."""
    import uuid

    from temporalio.api.common.v1 import WorkflowExecution
    from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer

    from activities.floor.models import floor_workflow_id
    from workers.floor_reset import failing_event, reset_point, trailing_failures
    from workflows.acquisition.workflow import AcquisitionWorkflow
    from workflows.floor.workflow import FloorKeeperWorkflow

    s = settings()
    r = known_region(s, region)
    bounds.identifier("CONTRACT", contract)
    by = bounds.text("--by", by, max_len=bounds.MAX_ID)
    reason = bounds.text("--reason", reason)
    if event_id is not None:
        bounds.whole("--event-id", event_id, low=1, high=2**62)
    wid = floor_workflow_id(r, contract)

    async def go() -> tuple[int | None, str, str]:
        from temporalio.service import RPCError, RPCStatusCode

        client = await temporal_client(s, r)
        try:
            history = await client.get_workflow_handle(wid).fetch_history()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                fail(f"CONTRACT {contract}: no floor keeper {wid} in {r}")
            raise
        point: int | None
        if event_id is not None:
            point, why = event_id, f"--event-id {event_id}"
        else:
            replayed = await Replayer(
                workflows=[FloorKeeperWorkflow, AcquisitionWorkflow],
                data_converter=pydantic_data_converter,
            ).replay_workflow(history, raise_on_replay_failure=False)
            bad = failing_event(str(replayed.replay_failure or ""))
            failing = trailing_failures(history.events)
            if bad is None and not failing:
                return None, "", ""
            point = reset_point(history.events, bad)
            why = (
                f"replay with this code fails at event {bad}"
                if bad is not None
                else f"its last {len(failing)} workflow task(s) failed"
            )
            if point is None:
                fail(
                    f"{wid}: {why}, in its first workflow task: no earlier task to reset to; "
                    "choose one with --event-id"
                )
        if dry_run:
            return point, why, ""
        reset = await client.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=wid),
                reason=f"sco floor reset by {by}: {reason}",
                workflow_task_finish_event_id=point,
                request_id=str(uuid.uuid4()),
            )
        )
        return point, why, reset.run_id

    point, why, run_id = run_temporal(go())
    if json_out:
        print_json(
            {
                "workflow_id": wid,
                "reset_to_event": point,
                "why": why,
                "new_run_id": run_id or None,
                "dry_run": dry_run,
                "ui_url": workflow_url(s, r, wid),
            }
        )
        return
    if point is None:
        console.print(f"{wid} replays clean with this code and no task is failing: not reset")
        return
    if not run_id:
        console.print(f"{wid} would be reset to event {point} ({why}); --dry-run: not reset")
        return
    console.print(f"{wid} reset to event {point} ({why}): new run {run_id}")
    print_workflow_link(s, r, wid)
