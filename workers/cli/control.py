"""`sco worker | demand | acquisitions | controller | budget`: the control plane."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from workers.cli import audit, bounds, schedulers
from workers.cli.audit import ByOpt, ReasonOpt, operator_decision, who
from workers.cli.common import (
    console,
    errors_as_exit,
    fail,
    fleet_db,
    known_region,
    no_worker_message,
    print_json,
    print_workflow_link,
    print_workflow_urls,
    require_worker,
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
    from temporalio.client import WorkflowHandle

    from activities.budget import BudgetStatus
    from contracts.bundle import VerifiedBundle
    from contracts.model import Contract
    from workflows.acquisition.messages import AcquisitionProgress, ControlAck
    from workflows.controller.models import ControllerStatus

# Workflows are addressed by their handler names (the workflow modules would import the
# planner and activities into every command); the input and result models are the real ones.

T = TypeVar("T")

demand_app = typer.Typer(help="Demand per contract, in the contract's units.", no_args_is_help=True)
acq_app = typer.Typer(help="In-flight and past acquisitions.", no_args_is_help=True)
controller_app = typer.Typer(help="The region controller partitions.", no_args_is_help=True)
budget_app = typer.Typer(help="The region's provider API token budget.", no_args_is_help=True)
demand_app.command("sources")(schedulers.demand_sources)
demand_app.command("intake")(schedulers.demand_intake)
demand_app.command("collect")(schedulers.demand_collect)

RegionOpt = typer.Option(None, "--region", help="Region; default from settings.")
JsonOpt = typer.Option(False, "--json", help="The answer as JSON (its schema: docs/reference.md).")
DEMAND_SOURCES = ("cli", "slurm", "kubernetes")
#: A query's own deadline, inside the command's: a workflow answers only on a worker.
QUERY_TIMEOUT = timedelta(seconds=3)


def worker(region: str = RegionOpt) -> None:
    """Serve the region's task queue until SIGTERM/Ctrl-C (graceful shutdown); metrics on
    `worker.metrics_port`, health on `worker.health_port`."""
    import psycopg

    from services.registry import service

    s = settings()
    with errors_as_exit(psycopg.Error, RuntimeError, OSError):
        asyncio.run(service("worker").load()(s, known_region(s, region)))


# -- demand --------------------------------------------------------------------------------


# A negative number is a value to check ("must be >= 0"), not an unknown option.
NUMBERS_MAY_BE_NEGATIVE = {"ignore_unknown_options": True}


@demand_app.command("set", context_settings=NUMBERS_MAY_BE_NEGATIVE)
def demand_set(
    contract: str = typer.Argument(..., help="Contract name (from the installed bundle)."),
    units: int = typer.Argument(..., min=0, help="Demand in the contract's units; 0 clears."),
    region: str = RegionOpt,
    source: str = typer.Option("cli", help="Demand source (cli, slurm, kubernetes)."),
    by: str | None = ByOpt,
    reason: str | None = ReasonOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Set a contract's demand and wake its controller partition (recorded as a decision).
    Units above the contract's most per region are refused; nothing is stored then."""
    from activities.control.partition import partition_of
    from activities.decisions import DecisionKind
    from activities.fleet.control_state import ControlRepository
    from workflows.controller.models import controller_workflow_id

    s = settings()
    r = known_region(s, region)
    if source not in DEMAND_SOURCES:
        fail(f"--source {source!r}: one of {', '.join(DEMAND_SOURCES)}")
    operator, why = who(by), audit.why(reason)
    c = _contract(s, contract, r)
    bounds.demand(c, r, units)
    decision = operator_decision(
        s,
        region=r,
        kind=DecisionKind.DEMAND,
        subject=contract,
        outcome="set",
        by=operator,
        reason=why or f"{units} units from {source}",
        units=units,
    )
    with fleet_db(s) as pool:
        changed = ControlRepository(pool).set_demand(r, source, {contract: units})
        if not changed:
            decision = decision.model_copy(update={"outcome": "unchanged"})
        audit.record(s, decision, pool)
    partition = partition_of(contract, s.control.partitions)
    where = controller_workflow_id(r, partition)
    answer = {
        "contract": contract,
        "region": r,
        "source": source,
        "units": units,
        "changed": changed,
        "controller": where,
        "signalled": False,
        "ui_url": workflow_url(s, r, where),
    }
    if not changed:
        if json_out:
            print_json(answer)
            return
        console.print(f"{contract} in {r}: already {units} units ({source}); nothing changed")
        return
    signalled = run_temporal(_signal_demand(s, r, partition, contract, source))
    if json_out:
        print_json({**answer, "signalled": signalled})
        return
    console.print(f"{contract} in {r}: {units} units ({source})")
    if signalled:
        console.print(f"signalled {where}")
    else:
        console.print(
            f"[yellow]{where} is not running[/]: start the region's workers "
            f"(`sco worker --region {r}`); it plans at its first tick"
        )
    print_workflow_link(s, r, where)


async def _signal_demand(
    s: Settings, region: str, partition: int, contract: str, source: str
) -> bool:
    from temporalio.service import RPCError, RPCStatusCode

    from workflows.controller.models import (
        DEMAND_CHANGED_SIGNAL,
        DemandChanged,
        controller_workflow_id,
    )

    client = await temporal_client(s, region)
    handle = client.get_workflow_handle(controller_workflow_id(region, partition))
    try:
        await handle.signal(
            DEMAND_CHANGED_SIGNAL, DemandChanged(contracts=[contract], source=source)
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


@demand_app.command("list")
def demand_list(region: str = RegionOpt, json_out: bool = typer.Option(False, "--json")) -> None:
    """Demand per contract and source, and the headroom each contract holds beyond it now
    (its headroom_units, or an open headroom schedule's; from the installed bundle)."""
    from activities.control.partition import partition_of
    from activities.fleet.control_state import ControlRepository
    from contracts.bundle import installed_bundle
    from contracts.headroom import headroom_at

    s = settings()
    r = known_region(s, region)
    with fleet_db(s) as pool:
        rows = ControlRepository(pool).list_demand(r)
    bundle, _ = installed_bundle(s.bundle_cache_dir, s.trust_dir)
    now = datetime.now(UTC)
    headroom: dict[str, tuple[int, str]] = {
        c.name: headroom_at(c, now)
        for c in (bundle.content.contracts if bundle is not None else [])
        if r in c.regions
    }
    if json_out:
        print_json(
            [
                {
                    **row.model_dump(mode="json"),
                    "headroom_units": headroom.get(row.workload, (None, ""))[0],
                    "headroom_why": headroom.get(row.workload, (None, ""))[1],
                }
                for row in rows
            ]
        )
        return
    table(
        f"demand in {r}",
        ["contract", "source", "units", "headroom", "partition", "updated"],
        [
            (
                x.workload,
                x.source,
                x.units,
                headroom.get(x.workload, ("", ""))[0],
                partition_of(x.workload, s.control.partitions),
                x.updated_at,
            )
            for x in rows
        ],
    )
    held = {n: h for n, h in headroom.items() if h[0]}
    for name, (units, why) in sorted(held.items()):
        console.print(f"{name}: {units} headroom units held ready beyond demand ({why})")


def _bundle(s: Settings) -> VerifiedBundle:
    from contracts.bundle import installed_bundle

    bundle, problem = installed_bundle(s.bundle_cache_dir, s.trust_dir)
    if bundle is None:
        fail(problem)
    return bundle


def _contract(s: Settings, name: str, region: str) -> Contract:
    """The contract NAME from the installed bundle, running in REGION, or a one-line error."""
    bounds.identifier("contract", name)
    bundle = _bundle(s)
    c = bundle.content.contract(name)
    if c is None:
        known = ", ".join(x.name for x in bundle.content.contracts)
        fail(f"contract {name!r} is not in bundle serial {bundle.serial} (known: {known})")
    if region not in c.regions:
        fail(f"contract {name!r} does not run in {region} (regions: {', '.join(c.regions)})")
    return c


def _acquisition_id(s: Settings, acquisition_id: str, region: str) -> str:
    """ACQUISITION_ID when it is an id, and not one the controller of another region made."""
    from activities.control.models import ACQUISITION_PREFIX

    bounds.identifier("ACQUISITION_ID", acquisition_id)
    for other in s.regions:
        if other != region and acquisition_id.startswith(f"{ACQUISITION_PREFIX}{other}-"):
            fail(
                f"ACQUISITION_ID {acquisition_id}: an acquisition of region {other}, not "
                f"{region} (add --region {other})"
            )
    return acquisition_id


# -- acquisitions --------------------------------------------------------------------------


@acq_app.command("list")
def acq_list(
    region: str = RegionOpt,
    all_: bool = typer.Option(False, "--all", help="Include finished acquisitions."),
    state: str = typer.Option(None, help="Only this state (running, paused, waiting_approval...)."),
    contract: str = typer.Option(None, help="Only this contract."),
    limit: int = typer.Option(50, min=1, max=1000),
    json_out: bool = JsonOpt,
) -> None:
    """Acquisitions as the Temporal UI lists them (same search attributes). An unknown
    --contract or --state is an error, not an empty list."""
    from workflows import search_attributes as sa
    from workflows.acquisition.messages import AcquisitionState

    s = settings()
    r = known_region(s, region)
    if state is not None and state not in {x.value for x in AcquisitionState}:
        fail(f"--state {state!r}: one of {', '.join(x.value for x in AcquisitionState)}")
    if contract is not None:
        _contract(s, contract, r)
    query = f'WorkflowType = "AcquisitionWorkflow" AND {sa.REGION.name} = "{r}"'
    if not all_:
        query += ' AND ExecutionStatus = "Running"'
    if state:
        query += f' AND {sa.STATE.name} = "{state}"'
    if contract:
        query += f' AND {sa.WORKLOAD.name} = "{contract}"'

    from workflows.acquisition.messages import PROGRESS_QUERY, AcquisitionProgress

    async def units(client: Any, wf: Any) -> tuple[int | None, int | None]:
        """(acquired, requested) units from the acquisition's progress; demand is in units,
        the search attributes count instances. A completed one's is in its result (the
        close event: one read, no worker replays its history); a running one answers its
        progress query. Unknown when no worker answers in time."""
        from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
        from temporalio.service import RPCError

        handle = client.get_workflow_handle(wf.id, run_id=wf.run_id, result_type=dict)
        timeout = timedelta(seconds=3)
        try:
            if wf.status == WorkflowExecutionStatus.COMPLETED:
                result = await handle.result(rpc_timeout=timeout)
                p = AcquisitionProgress.model_validate(result["progress"])
            else:
                p = await handle.query(
                    PROGRESS_QUERY, result_type=AcquisitionProgress, rpc_timeout=timeout
                )
        except (RPCError, WorkflowFailureError, KeyError, ValueError):
            return None, None
        return p.requested_units - p.shortfall_units, p.requested_units

    async def go() -> list[dict[str, Any]]:
        client = await temporal_client(s, r)
        out = []
        listed = [wf async for wf in client.list_workflows(query, limit=limit)]
        per_row = await asyncio.gather(*(units(client, wf) for wf in listed))
        for wf, (units_acquired, units_requested) in zip(listed, per_row, strict=True):
            attrs = wf.typed_search_attributes
            out.append(
                {
                    "id": wf.id,
                    "contract": attrs.get(sa.WORKLOAD),
                    "state": attrs.get(sa.STATE),
                    "units_requested": units_requested,
                    "units_acquired": units_acquired,
                    "requested": attrs.get(sa.REQUESTED),
                    "acquired": attrs.get(sa.ACQUIRED),
                    "halls": ",".join(attrs.get(sa.HALL) or []),
                    "pools": len(attrs.get(sa.POOL) or []),
                    "status": wf.status.name if wf.status else "",
                    "started": f"{wf.start_time:%Y-%m-%d %H:%M:%S}",
                    "ui_url": workflow_url(s, r, wf.id),
                }
            )
        return out

    rows = run_temporal(go())
    if json_out:
        print_json(rows)
        return
    table(
        f"acquisitions in {r} ({'all' if all_ else 'running'})",
        [
            "id",
            "contract",
            "state",
            "units requested",
            "units acquired",
            "instances requested",
            "instances acquired",
            "halls",
            "pools",
            "status",
            "started",
        ],
        [tuple("?" if v is None else v for k, v in x.items() if k != "ui_url") for x in rows],
    )
    print_workflow_urls(s, r, [x["id"] for x in rows])


def _handle(
    s: Settings, region: str, acquisition_id: str, *, need_worker: bool
) -> Callable[[], Awaitable[WorkflowHandle[Any, Any]]]:
    """The acquisition's handle after checking it exists; with NEED_WORKER (a query or an
    update, which a workflow answers only on a worker), after checking a worker polls."""

    async def get() -> WorkflowHandle[Any, Any]:
        from temporalio.service import RPCError, RPCStatusCode

        client = await temporal_client(s, region)
        handle = client.get_workflow_handle(acquisition_id)
        try:
            await handle.describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                fail(f"ACQUISITION_ID {acquisition_id}: no such acquisition in {region}")
            raise
        if need_worker:
            await require_worker(client, region)
        return handle

    return get


@acq_app.command("show")
def acq_show(
    acquisition_id: str = typer.Argument(...),
    region: str = RegionOpt,
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Progress of one acquisition (its `progress` query; works after it finished too)."""
    s = settings()
    r = known_region(s, region)
    _acquisition_id(s, acquisition_id, r)

    from workflows.acquisition.messages import PROGRESS_QUERY, AcquisitionProgress

    async def go() -> AcquisitionProgress:
        handle = await _handle(s, r, acquisition_id, need_worker=True)()
        progress: AcquisitionProgress = await handle.query(
            PROGRESS_QUERY, result_type=AcquisitionProgress
        )
        return progress

    p = run_temporal(go())
    if json_out:
        print_json(
            {**p.model_dump(mode="json"), "ui_url": workflow_url(s, p.region, acquisition_id)}
        )
        return
    console.print(
        f"[bold]{p.acquisition_id}[/] {p.contract} in {p.region}: [bold]{p.state.value}[/]"
    )
    print_workflow_link(s, p.region, acquisition_id)
    console.print(
        f"  instances: {p.active} active / {p.launched} launched / {p.requested_instances} "
        f"requested, {p.failed} failed, {p.deleted} deleted; {p.shortfall_units} units short"
    )
    if p.capacity_errors:
        console.print(f"  capacity errors: {p.capacity_errors}")
    if p.fallback.value != "none":
        console.print(
            f"  fallback: {p.fallback.value}, {p.fallback_cost_per_hour:.2f}/h: {p.fallback_reason}"
        )
        if p.decided_by:
            console.print(f"  decided by {p.decided_by}: {p.decision_reason}")
    if p.paused_by:
        console.print(f"  paused by {p.paused_by}")
    console.print(f"  halls {', '.join(p.halls)}; pools {', '.join(p.pools)}")


def _operator_update(name: str) -> Callable[..., None]:
    def command(
        acquisition_id: str = typer.Argument(...),
        region: str = RegionOpt,
        operator: str = typer.Option("operator", "--by", help="Who does this (recorded)."),
        reason: str | None = typer.Option(None, help="Why (recorded)."),
        json_out: bool = JsonOpt,
    ) -> None:
        from workflows.acquisition.messages import ControlAck, OperatorInput

        s = settings()
        r = known_region(s, region)
        _acquisition_id(s, acquisition_id, r)
        operator = bounds.text("--by", operator, max_len=bounds.MAX_ID)
        reason = audit.why(reason)
        who_am_i = audit.identity(s)

        async def go() -> ControlAck:
            handle = await _handle(s, r, acquisition_id, need_worker=True)()
            ack: ControlAck = await handle.execute_update(
                name,
                OperatorInput(operator=operator, reason=reason, identity=who_am_i),
                result_type=ControlAck,
            )
            return ack

        ack = run_temporal(go())
        if json_out:
            print_json(_ack_json(s, r, acquisition_id, ack))
            return
        console.print(f"{acquisition_id}: {ack.message} (state {ack.state.value})")
        print_workflow_link(s, r, acquisition_id)
        if name == "cancel":
            # Demand is unchanged, so the controller's next tick plans the shortfall anew.
            console.print(
                "the controller will acquire again at its next tick unless demand is lowered "
                "(`sco demand set CONTRACT UNITS`)"
            )

    command.__doc__ = {
        "pause": "Pause: no new creates until resumed (in-flight boots finish).",
        "resume": "Resume a paused acquisition.",
        "cancel": "Cancel: stop launching and delete every instance it created.",
    }[name]
    return command


def _ack_json(s: Settings, region: str, acquisition_id: str, ack: ControlAck) -> dict[str, Any]:
    return {
        "acquisition_id": acquisition_id,
        "region": region,
        **ack.model_dump(mode="json"),
        "ui_url": workflow_url(s, region, acquisition_id),
    }


for _name in ("pause", "resume", "cancel"):
    acq_app.command(_name)(_operator_update(_name))


@acq_app.command("approve")
def acq_approve(
    acquisition_id: str = typer.Argument(...),
    region: str = RegionOpt,
    by: str = typer.Option(..., "--by", help="Approver (recorded in the ledger)."),
    reason: str = typer.Option(..., help="Why (recorded in the ledger)."),
    decline: bool = typer.Option(False, "--decline", help="Decline instead of approving."),
    json_out: bool = JsonOpt,
) -> None:
    """Approve (or decline) committed fallback above the contract's spend authority."""
    from workflows.acquisition.messages import APPROVE_FALLBACK_UPDATE, ApprovalInput, ControlAck

    s = settings()
    r = known_region(s, region)
    _acquisition_id(s, acquisition_id, r)
    by = bounds.text("--by", by, max_len=bounds.MAX_ID)
    reason = bounds.text("--reason", reason)

    async def go() -> ControlAck:
        handle = await _handle(s, r, acquisition_id, need_worker=True)()
        ack: ControlAck = await handle.execute_update(
            APPROVE_FALLBACK_UPDATE,
            ApprovalInput(
                approver=by, reason=reason, approve=not decline, identity=audit.identity(s)
            ),
            result_type=ControlAck,
        )
        return ack

    ack = run_temporal(go())
    if json_out:
        print_json(_ack_json(s, r, acquisition_id, ack))
        return
    console.print(f"{acquisition_id}: {ack.message}")
    print_workflow_link(s, r, acquisition_id)


# -- controller ----------------------------------------------------------------------------


@controller_app.command("start")
def controller_start(region: str = RegionOpt, json_out: bool = JsonOpt) -> None:
    """Start the region's controller partitions that are not running (idempotent); refused
    when no worker polls the region's task queue (they would wait for one)."""
    from services.region_worker.service import ensure_controllers

    s = settings()
    r = known_region(s, region)

    start_region_workflows(s, r, ensure_controllers, json_out=json_out)


@controller_app.command("status")
def controller_status(
    region: str = RegionOpt, json_out: bool = typer.Option(False, "--json")
) -> None:
    """Each partition's last tick: demand, headroom held beyond it, held, planned,
    shortfall, acquisitions."""
    from temporalio.service import RPCError

    from workflows.controller.models import STATUS_QUERY, ControllerStatus, controller_workflow_id

    s = settings()
    r = known_region(s, region)

    async def go() -> list[ControllerStatus | str]:
        client = await temporal_client(s, r)
        worker = await worker_runs(client, r)

        async def one(partition: int) -> ControllerStatus | str:
            wid = controller_workflow_id(r, partition)
            try:
                st: ControllerStatus = await client.get_workflow_handle(wid).query(
                    STATUS_QUERY, result_type=ControllerStatus, rpc_timeout=QUERY_TIMEOUT
                )
            except RPCError as exc:
                why = exc.message if worker else no_worker_message(client.namespace, r)
                return f"{wid}: {why}"
            return st

        # At once: with no worker each query waits out its timeout.
        return list(await asyncio.gather(*(one(p) for p in range(s.control.partitions))))

    rows = run_temporal(go())
    if json_out:
        print_json(
            [
                {
                    **x.model_dump(mode="json"),
                    "ui_url": workflow_url(s, r, controller_workflow_id(r, x.partition)),
                }
                if isinstance(x, ControllerStatus)
                else x
                for x in rows
            ]
        )
        return
    lines: list[tuple[object, ...]] = []
    for x in rows:
        if isinstance(x, str):
            lines.append((x, "", "", "", "", "", "", "", ""))
            continue
        last = x.last
        lines.append(
            (
                controller_workflow_id(x.region, x.partition),
                x.ticks,
                last.demand_units if last else "",
                last.headroom_units if last else "",
                last.held_units if last else "",
                last.planned_units if last else "",
                last.shortfall_units if last else "",
                x.acquisitions_started,
                (last.problem or f"last tick {last.at:%H:%M:%S}") if last else "no tick yet",
            )
        )
    table(
        f"controllers in {r}",
        [
            "controller",
            "ticks",
            "demand",
            "headroom",
            "held",
            "planned",
            "short",
            "acquisitions",
            "note",
        ],
        lines,
    )
    print_workflow_urls(s, r, [controller_workflow_id(r, p) for p in range(s.control.partitions)])


# -- budget --------------------------------------------------------------------------------


@budget_app.command("status")
def budget_status(region: str = RegionOpt, json_out: bool = typer.Option(False, "--json")) -> None:
    """The region's token bucket: rate, burst, tokens now, queue."""
    from activities.budget import STATUS_QUERY, BudgetStatus, budget_workflow_id

    s = settings()
    r = known_region(s, region)

    async def go() -> BudgetStatus:
        client = await temporal_client(s, r)
        await require_worker(client, r)
        st: BudgetStatus = await client.get_workflow_handle(budget_workflow_id(r)).query(
            STATUS_QUERY, result_type=BudgetStatus
        )
        return st

    st = run_temporal(go())
    if json_out:
        print_json(
            {**st.model_dump(mode="json"), "ui_url": workflow_url(s, r, budget_workflow_id(r))}
        )
        return
    table(
        f"API budget in {r}",
        ["rate/s", "burst", "tokens now", "queued", "queued tokens", "granted", "requests"],
        [
            (
                f"{st.rate_per_second:g}",
                st.burst,
                f"{st.tokens_available:.1f}",
                st.queued,
                st.queued_tokens,
                st.granted_total,
                st.requests_total,
            )
        ],
    )
    print_workflow_urls(s, r, [budget_workflow_id(r)])


@budget_app.command("set-rate", context_settings=NUMBERS_MAY_BE_NEGATIVE)
def budget_set_rate(
    rate: float = typer.Argument(..., min=0, help="Tokens (mutating API calls) per second."),
    burst: int = typer.Argument(..., min=1, help="Bucket size."),
    region: str = RegionOpt,
    by: str | None = ByOpt,
    reason: str | None = ReasonOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Change the region's API budget (takes effect at once, survives restarts); within
    the provider's limit (`provider.api_rate_limit_per_second`, `provider.api_burst_limit`)."""
    from temporalio.service import RPCError, RPCStatusCode

    from activities.budget import SET_RATE_SIGNAL, SetRateInput, budget_workflow_id
    from activities.decisions import DecisionKind

    s = settings()
    r = known_region(s, region)
    bounds.budget(s, rate, burst)
    operator, why = who(by), audit.why(reason)
    decision = operator_decision(
        s,
        region=r,
        kind=DecisionKind.BUDGET,
        subject=r,
        outcome="rate_set",
        by=operator,
        reason=f"{rate}/s, burst {burst}" + (f": {why}" if why else ""),
    )

    async def go() -> bool:
        client = await temporal_client(s, r)
        handle = client.get_workflow_handle(budget_workflow_id(r))
        try:
            await handle.describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                fail(
                    f"{budget_workflow_id(r)} is not running in {r}: the region's worker "
                    f"starts it (`sco worker --region {r}`)"
                )
            raise
        # A signal is durable: with no worker it waits in the history, and says so.
        await handle.signal(SET_RATE_SIGNAL, SetRateInput(rate_per_second=rate, burst=burst))
        return await worker_runs(client, r)

    worker = run_temporal(go())
    audit.record(s, decision)
    if json_out:
        print_json(
            {
                "region": r,
                "rate_per_second": rate,
                "burst": burst,
                "applied": worker,
                "ui_url": workflow_url(s, r, budget_workflow_id(r)),
            }
        )
        return
    console.print(f"{r}: budget {rate}/s, burst {burst}")
    if not worker:
        console.print(
            f"[yellow]note:[/] no worker polls {r}'s task queue: the budget takes the new "
            f"rate when the {r} worker runs"
        )
    print_workflow_link(s, r, budget_workflow_id(r))
