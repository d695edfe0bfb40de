"""`sco pool exclude | readmit | status | list`: the pool exclusion cycle, by hand.

Exclude and re-admit are updates of the pool's exclusion workflow, which is started first
when it is not running (so an operator can act on a pool that never had a notice).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from workers.cli import audit, bounds
from workers.cli.common import (
    console,
    fail,
    fleet_db,
    known_region,
    print_json,
    print_workflow_link,
    require_worker,
    run_temporal,
    settings,
    table,
    temporal_client,
    workflow_url,
)
from workers.settings import Settings

if TYPE_CHECKING:
    from temporalio.client import WorkflowHandle

    from activities.exclusion.models import ExclusionRow
    from workflows.exclusion.models import ExclusionAck, ExclusionStatus

pool_app = typer.Typer(
    help="Pool exclusion: keep reclaim-prone pools out of plans.", no_args_is_help=True
)

PoolArg = typer.Argument(..., help="Pool id, e.g. r1.A.gp.l.")
ByOpt = typer.Option(..., "--by", help="Who does this (recorded in the ledger).")
ReasonOpt = typer.Option(..., "--reason", help="Why (recorded in the ledger).")
JsonOpt = typer.Option(False, "--json", help="The answer as JSON (its schema: docs/reference.md).")


def _region(s: Settings, pool_id: str) -> str:
    """The pool's region, after checking the region file knows the pool."""
    from contracts.pool_id import PoolId
    from contracts.region import RegionFileError, load_region

    try:
        region = PoolId.parse(pool_id).region
    except ValueError as exc:
        fail(str(exc))
    known_region(s, region)
    try:
        load_region(s.region_file(region)).pool(pool_id)
    except (RegionFileError, FileNotFoundError) as exc:
        fail(f"region {region}: {exc}")
    except KeyError:
        fail(f"no pool {pool_id} in region {region}")
    return region


async def _running(s: Settings, region: str, pool_id: str) -> WorkflowHandle[Any, Any]:
    """The pool's exclusion cycle, started when it is not running (a worker must poll)."""
    from temporalio.common import WorkflowIDConflictPolicy

    from workflows.exclusion.models import exclusion_input, exclusion_workflow_id

    client = await temporal_client(s, region)
    # Started with no worker, the cycle would wait forever and the update with it: nothing
    # is started then (the operator hears which worker is missing).
    await require_worker(client, region)
    handle: WorkflowHandle[Any, Any] = await client.start_workflow(
        "PoolExclusionWorkflow",
        exclusion_input(pool_id),
        id=exclusion_workflow_id(pool_id),
        task_queue=s.temporal.task_queue(region),
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return handle


def _operator(by: str, reason: str) -> tuple[str, str]:
    return bounds.text("--by", by, max_len=bounds.MAX_ID), bounds.text("--reason", reason)


def _print_ack(
    s: Settings, region: str, pool_id: str, ack: ExclusionAck, json_out: bool = False
) -> None:
    from workflows.exclusion.models import exclusion_workflow_id

    if json_out:
        wid = exclusion_workflow_id(pool_id)
        print_json(
            {
                "pool_id": pool_id,
                "region": region,
                **ack.model_dump(mode="json"),
                "ui_url": workflow_url(s, region, wid),
            }
        )
        return

    until = f", until {ack.excluded_until:%Y-%m-%d %H:%M:%S} UTC" if ack.excluded_until else ""
    console.print(
        f"{pool_id}: {ack.message} (state {ack.state.value}, strikes {ack.strikes}{until})"
    )
    print_workflow_link(s, region, exclusion_workflow_id(pool_id))


@pool_app.command("exclude")
def exclude(
    pool_id: str = PoolArg,
    by: str = ByOpt,
    reason: str = ReasonOpt,
    hours: float = typer.Option(
        None, "--hours", min=0.01, help="Probe and re-admit after this long; default: never."
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Exclude a pool now: the planner stops using it."""
    from workflows.exclusion.models import EXCLUDE_UPDATE, ExclusionAck, OperatorExclude

    s = settings()
    region = _region(s, pool_id)
    by, reason = _operator(by, reason)
    bounds.hours("--hours", hours)

    async def go() -> ExclusionAck:
        handle = await _running(s, region, pool_id)
        ack: ExclusionAck = await handle.execute_update(
            EXCLUDE_UPDATE,
            OperatorExclude(operator=by, reason=reason, hours=hours, identity=audit.identity(s)),
            result_type=ExclusionAck,
        )
        return ack

    _print_ack(s, region, pool_id, run_temporal(go()), json_out)


@pool_app.command("readmit")
def readmit(
    pool_id: str = PoolArg, by: str = ByOpt, reason: str = ReasonOpt, json_out: bool = JsonOpt
) -> None:
    """Re-admit an excluded or probing pool now (cancels a probe; strikes reset)."""
    from workflows.exclusion.models import READMIT_UPDATE, ExclusionAck, OperatorReadmit

    s = settings()
    region = _region(s, pool_id)
    by, reason = _operator(by, reason)

    async def go() -> ExclusionAck:
        handle = await _running(s, region, pool_id)
        ack: ExclusionAck = await handle.execute_update(
            READMIT_UPDATE,
            OperatorReadmit(operator=by, reason=reason, identity=audit.identity(s)),
            result_type=ExclusionAck,
        )
        return ack

    _print_ack(s, region, pool_id, run_temporal(go()), json_out)


@pool_app.command("status")
def status(pool_id: str = PoolArg, json_out: bool = typer.Option(False, "--json")) -> None:
    """The pool's exclusion state, notices in the window and recent transitions."""
    from temporalio.service import RPCError, RPCStatusCode

    from activities.exclusion.models import PoolState
    from workflows.exclusion.models import STATUS_QUERY, ExclusionStatus, exclusion_workflow_id

    s = settings()
    region = _region(s, pool_id)

    async def go() -> ExclusionStatus:
        client = await temporal_client(s, region)
        handle = client.get_workflow_handle(exclusion_workflow_id(pool_id))
        try:
            st: ExclusionStatus = await handle.query(STATUS_QUERY, result_type=ExclusionStatus)
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            # No notice and no operator action ever started the pool's cycle: admitted.
            return ExclusionStatus(
                pool_id=pool_id,
                region=region,
                state=PoolState.ADMITTED,
                strikes=0,
                notices_in_window=0,
                reason="no notices",
            )
        return st

    st = run_temporal(go())
    wid = exclusion_workflow_id(pool_id)
    if json_out:
        print_json({**st.model_dump(mode="json"), "ui_url": workflow_url(s, region, wid)})
        return
    until = f" until {st.excluded_until:%Y-%m-%d %H:%M:%S} UTC" if st.excluded_until else ""
    console.print(f"[bold]{st.pool_id}[/]: [bold]{st.state.value}[/]{until}")
    print_workflow_link(s, region, wid)
    if not st.history and not st.set_by:
        console.print("  no notices, no transitions")
        return
    console.print(
        f"  strikes {st.strikes}; {st.notices_in_window} notice(s) in the window; "
        f"set by {st.set_by}: {st.reason or '-'}"
    )
    if st.probe_id:
        console.print(f"  probing with {st.probe_id}")
    table(
        "recent transitions",
        ["at", "from", "to", "strikes", "by", "reason"],
        [
            (
                f"{t.at:%Y-%m-%d %H:%M:%S}",
                t.from_state.value,
                t.to_state.value,
                t.strikes,
                t.actor,
                t.reason,
            )
            for t in st.history
        ],
    )


@pool_app.command("list")
def list_(
    region: str = typer.Option(None, "--region", help="Region; default from settings."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Pools with an exclusions row (admitted ones included, with their strikes)."""
    from activities.exclusion.activities import list_exclusions

    s = settings()
    r = known_region(s, region)
    with fleet_db(s) as pool:
        rows: list[ExclusionRow] = list_exclusions(pool, r)
    if json_out:
        print_json([row.model_dump(mode="json") for row in rows])
        return
    table(
        f"pool exclusions in {r}",
        ["pool", "state", "strikes", "until", "set by", "reason", "updated"],
        [
            (
                x.pool_id,
                x.state.value,
                x.strikes,
                f"{x.excluded_until:%Y-%m-%d %H:%M:%S}" if x.excluded_until else "",
                x.set_by,
                x.reason,
                f"{x.updated_at:%Y-%m-%d %H:%M:%S}",
            )
            for x in rows
        ],
    )
