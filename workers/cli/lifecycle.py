"""`sco lifecycle start|pause|resume|status`: the region's voluntary disruptions (drift,
return from fallback, expiry, consolidation) by the lifecycle workflow."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import typer

from workers.cli import audit, bounds
from workers.cli.common import (
    console,
    fail,
    known_region,
    print_json,
    print_workflow_link,
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
    from workflows.lifecycle.models import LifecycleStatus, PauseInput

lifecycle_app = typer.Typer(
    help=(
        "Voluntary disruption (drift, return from fallback, expiry, consolidation): "
        "the lifecycle workflow."
    ),
    no_args_is_help=True,
)

RegionOpt = typer.Option(None, "--region", help="Region; default from settings.")
ContractOpt = typer.Option(
    None, "--contract", help="Only this contract (default: the whole region)."
)
JsonOpt = typer.Option(False, "--json", help="The answer as JSON (its schema: docs/reference.md).")


def _not_running(region: str) -> str:
    return (
        f"no lifecycle workflow runs in {region}: start it with "
        f"`sco lifecycle start --region {region}` (lifecycle.enabled starts it with the worker)"
    )


async def _tell(s: Settings, region: str, signal: str, event: PauseInput) -> bool:
    """Signal the region's lifecycle workflow (durable); whether a worker runs to act on it."""
    from temporalio.service import RPCError, RPCStatusCode

    from activities.lifecycle.models import lifecycle_workflow_id

    client = await temporal_client(s, region)
    try:
        await client.get_workflow_handle(lifecycle_workflow_id(region)).signal(signal, event)
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            fail(_not_running(region))
        raise
    return await worker_runs(client, region)


def _pause_command(pause: bool) -> Any:
    verb = "paused" if pause else "resumed"

    def command(
        region: str = RegionOpt,
        contract: str | None = ContractOpt,
        by: str | None = audit.ByOpt,
        reason: str | None = audit.ReasonOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        from activities.lifecycle.models import lifecycle_workflow_id
        from workflows.lifecycle.models import PAUSE_SIGNAL, RESUME_SIGNAL, PauseInput

        s = settings()
        r = known_region(s, region)
        if contract is not None:
            bounds.identifier("--contract", contract)
        event = PauseInput(
            contract=contract or "",
            operator=audit.who(by),
            reason=bounds.optional_text("--reason", reason) or "",
            identity=audit.identity(s),
        )
        worker = run_temporal(_tell(s, r, PAUSE_SIGNAL if pause else RESUME_SIGNAL, event))
        wid = lifecycle_workflow_id(r)
        if json_out:
            print_json(
                {
                    "region": r,
                    "contract": contract,
                    "event": verb,
                    "workflow_id": wid,
                    "ui_url": workflow_url(s, r, wid),
                    "worker_running": worker,
                }
            )
            return
        scope = f"contract {contract}" if contract else "every contract"
        console.print(f"voluntary disruption {verb} in {r} for {scope} (recorded)")
        if not worker:
            console.print(
                f"[yellow]note:[/] no worker polls {r}'s task queue: the lifecycle workflow "
                f"acts on it when the {r} worker runs"
            )
        print_workflow_link(s, r, wid)

    command.__doc__ = (
        "Pause voluntary disruption in the region (or of one contract): replacements under "
        "way finish, none starts. Hall-loss rebuilds and reclaims go on."
        if pause
        else "Resume voluntary disruption in the region (or of one contract)."
    )
    return command


lifecycle_app.command("pause")(_pause_command(True))
lifecycle_app.command("resume")(_pause_command(False))


@lifecycle_app.command("start")
def lifecycle_start(region: str = RegionOpt, json_out: bool = JsonOpt) -> None:
    """Start the region's lifecycle workflow (idempotent: a running one keeps its pauses);
    refused when lifecycle.enabled is false or no worker polls the region's task queue."""
    from services.region_worker.service import ensure_lifecycle

    s = settings()
    r = known_region(s, region)
    if not s.lifecycle.enabled:
        fail("lifecycle.enabled is false (SCO_LIFECYCLE__ENABLED): nothing started")

    start_region_workflows(s, r, ensure_lifecycle, json_out=json_out)


@lifecycle_app.command("status")
def lifecycle_status(region: str = RegionOpt, json_out: bool = JsonOpt) -> None:
    """The lifecycle workflow: paused or not (and which contracts), replacements under way,
    candidates held back and why, the latest replacements and the spend they saved."""
    from temporalio.service import RPCError, RPCStatusCode

    from activities.lifecycle.models import lifecycle_workflow_id
    from workflows.lifecycle.models import STATUS_QUERY, LifecycleStatus

    s = settings()
    r = known_region(s, region)
    wid = lifecycle_workflow_id(r)

    async def go() -> LifecycleStatus:
        client = await temporal_client(s, r)
        try:
            st: LifecycleStatus = await client.get_workflow_handle(wid).query(
                STATUS_QUERY, result_type=LifecycleStatus, rpc_timeout=timedelta(seconds=5)
            )
        except RPCError as exc:
            if exc.status is RPCStatusCode.NOT_FOUND:
                fail(_not_running(r))
            raise
        return st

    st = run_temporal(go())
    if json_out:
        print_json({**st.model_dump(mode="json"), "ui_url": workflow_url(s, r, wid)})
        return
    _show(st)
    print_workflow_link(s, r, wid)


def _show(st: LifecycleStatus) -> None:
    paused = "region paused" if st.paused else "running"
    if st.paused_contracts:
        paused += f"; paused contracts: {', '.join(st.paused_contracts)}"
    console.print(
        f"lifecycle {st.region}: {st.state.value} ({paused}); {st.rounds} rounds, "
        f"{st.replaced} replaced, saving {st.saved_per_hour:.3f}/h"
        + (f"; {st.reason}" if st.reason else "")
    )
    for hall, until in st.undrainable.items():
        console.print(
            f"hall {hall}: no notice relay answered a drain; its instances wait until "
            f"{until:%Y-%m-%d %H:%M} UTC (`sco notice-relay --region {st.region} --hall {hall}`)"
        )
    rows: list[tuple[object, ...]] = [
        (i, reason, "in flight") for i, reason in st.in_flight.items()
    ]
    rows += [(i, why, "held") for i, why in st.held.items()]
    if rows:
        table("candidates", ["instance", "reason", "state"], rows)
    if st.recent:
        table(
            "recent replacements",
            ["at", "instance", "reason", "outcome", "replacement", "saving/h", "why"],
            [
                (
                    f"{x.at:%Y-%m-%d %H:%M}",
                    x.instance_id,
                    x.reason,
                    x.outcome,
                    x.replacement,
                    f"{x.saving_per_hour:.3f}",
                    x.why,
                )
                for x in st.recent
            ],
        )
