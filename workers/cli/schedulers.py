"""`sco slurm ...` and `sco demand sources|intake|collect`: the schedulers as demand."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import typer

from workers.cli.common import (
    console,
    errors_as_exit,
    fail,
    fleet_db,
    print_json,
    print_workflow_link,
    run_temporal,
    settings,
    table,
    temporal_client,
    workflow_url,
)

if TYPE_CHECKING:
    from activities.demand.intake import CollectResult
    from workers.slurm_power_programs import Report
    from workflows.intake.models import IntakeStatus

# Imports of the scheduler, intake and Slurm code live in the commands: `sco demand set`
# loads this module (its `demand` group holds the commands below) and needs none of them.

slurm_app = typer.Typer(
    help="Slurm power saving: CLOUD nodes SCO brings up and releases.", no_args_is_help=True
)

RegionOpt = typer.Option(None, "--region", help="Region; default from settings.")
JsonOpt = typer.Option(False, "--json")


# -- slurm -------------------------------------------------------------------------------


#: CLOUD nodes weigh more than local ones (Slurm's default 1), so local capacity goes first.
CLOUD_NODE_WEIGHT = 1000


@slurm_app.command("conf")
def slurm_conf(
    pools: list[str] = typer.Option(..., "--pool", help="Pool id (repeat), e.g. r1.A.gp.l."),
    nodes: int = typer.Option(16, "--nodes", min=1, help="CLOUD nodes per pool."),
    partition: str = typer.Option("spot", "--partition", help="Partition of the nodes."),
    suspend_time: int = typer.Option(
        600, "--suspend-time", min=1, help="Idle seconds before a CLOUD node is powered down."
    ),
    region: str = RegionOpt,
) -> None:
    """The slurm.conf node and partition lines for SCO's CLOUD nodes of these pools."""
    from activities.demand.hostlist import HostlistError, ranged
    from activities.demand.slurm_resume import feature_list
    from contracts.region import RegionFileError, load_region

    s = settings()
    r = region or s.region
    with errors_as_exit(RegionFileError, OSError):
        reg = load_region(s.region_file(r))
    by_id = {reg.pool_id(p): p for p in reg.pools}
    lines = [f"# SCO CLOUD nodes of region {r}: `sco slurm conf` output; one line per pool."]
    names = []
    for pool_id in pools:
        pool = by_id.get(pool_id)
        if pool is None:
            fail(f"--pool {pool_id}: not a pool of region {r} (see `sco pools list`)")
        prefix = f"{r}-{pool.hall.lower()}-{pool.sku}-{pool.size}-"
        with errors_as_exit(HostlistError):
            hosts = ranged(prefix, nodes)
        names.append(hosts)
        features = ",".join(feature_list(pool_id, pool.hall, pool.sku, pool.size, "reclaimable"))
        gres = f" Gres=gpu:{pool.gpus}" if pool.gpus else ""
        lines.append(
            f"NodeName={hosts} CPUs={pool.vcpu} RealMemory={pool.memory_gib * 1024 - 512}"
            # Above the site's nodes (default Weight=1): Slurm fills local nodes first.
            f"{gres} Features={features} State=CLOUD Weight={CLOUD_NODE_WEIGHT}"
        )
    # Only this partition suspends; slurm.conf keeps SuspendTime=INFINITE globally so the
    # site's own nodes are never powered down (deploy/slurm/slurm.conf.fragment).
    lines.append(
        f"PartitionName={partition} Nodes={','.join(names)} MaxTime=INFINITE "
        f"SuspendTime={suspend_time} State=UP"
    )
    typer.echo("\n".join(lines))


def _show(report: Report, json_out: bool) -> None:
    if json_out:
        print_json(report.model_dump(mode="json"))
    else:
        console.print(
            f"{report.verb} {len(report.nodes)} node(s) in {report.region} "
            f"in {report.seconds:.2f} s"
        )
        for wid in report.started:
            console.print(f"  started {wid}")
        for wid in report.cancelled:
            console.print(f"  cancelled {wid} (still launching)")
        for node, why in sorted(report.refused.items()):
            console.print(f"  [red]refused[/] {node}: {why}")
    if report.refused:
        raise typer.Exit(1)


@slurm_app.command("resume")
def slurm_resume(
    hostlist: str = typer.Argument(..., help="Slurm hostlist, as slurmctld passes it."),
    resume_file: str = typer.Option(None, "--resume-file", help="A SLURM_RESUME_FILE copy."),
    json_out: bool = JsonOpt,
) -> None:
    """What ResumeProgram does: acquire instances named after the nodes."""
    import psycopg

    from workers.slurm_power_programs import ProgramError, resume

    s = settings()
    with errors_as_exit(ProgramError, psycopg.Error):
        _show(run_temporal(resume(s, hostlist, resume_file=resume_file)), json_out)


@slurm_app.command("suspend")
def slurm_suspend(hostlist: str = typer.Argument(...), json_out: bool = JsonOpt) -> None:
    """What SuspendProgram does: release the instances behind the nodes."""
    import psycopg

    from workers.slurm_power_programs import ProgramError, release
    from workflows.slurm.models import ReleaseReason

    s = settings()
    with errors_as_exit(ProgramError, psycopg.Error):
        _show(run_temporal(release(s, hostlist, ReleaseReason.SUSPEND)), json_out)


@slurm_app.command("resume-failed")
def slurm_resume_failed(hostlist: str = typer.Argument(...), json_out: bool = JsonOpt) -> None:
    """What ResumeFailProgram does: release, and count against the pools' exclusion."""
    import psycopg

    from workers.slurm_power_programs import ProgramError, release
    from workflows.slurm.models import ReleaseReason

    s = settings()
    with errors_as_exit(ProgramError, psycopg.Error):
        _show(run_temporal(release(s, hostlist, ReleaseReason.RESUME_FAILED)), json_out)


@slurm_app.command("nodes")
def slurm_nodes(
    region: str = RegionOpt, all_: bool = typer.Option(False, "--all"), json_out: bool = JsonOpt
) -> None:
    """Instances behind Slurm nodes (live ones; --all: deleted and failed too)."""
    from activities.fleet.repository import FleetRepository

    s = settings()
    r = region or s.region
    with fleet_db(s) as pool:
        rows = [x for x in FleetRepository(pool).list_instances(r) if x.hostname]
    if not all_:
        rows = [x for x in rows if x.state.value not in ("deleted", "failed")]
    if json_out:
        print_json([x.model_dump(mode="json") for x in rows])
        return
    table(
        f"Slurm nodes in {r}",
        ["node", "state", "contract", "pool", "instance", "since"],
        [
            (x.hostname, x.state.value, x.workload, x.pool_id, x.instance_id, x.state_changed_at)
            for x in rows
        ],
    )


# -- demand sources ----------------------------------------------------------------------


def demand_sources(region: str = RegionOpt, json_out: bool = JsonOpt) -> None:
    """Read every scheduler source now (Slurm pending jobs, unschedulable pods) and show
    their units per contract; stores nothing."""
    from activities.demand.intake import DemandIntakeActivities
    from activities.demand.source import SourceUnavailable
    from contracts.cache import installed_bundle
    from workers.demand_sources import sources_for

    s = settings()
    r = region or s.region
    with errors_as_exit(SourceUnavailable, ValueError, OSError):
        sources = sources_for(s)
    if not sources:
        fail("no scheduler source is on: set slurm.pending_demand or kubernetes.pending_demand")
    intake = DemandIntakeActivities(
        sources, None, lambda: installed_bundle(s.bundle_cache_dir, s.trust_dir)
    )
    result: CollectResult = asyncio.run(intake.read(r))
    if json_out:
        print_json(result.model_dump(mode="json"))
        return
    if result.problem:
        fail(result.problem)
    _reports_table(f"pending work in {r} (bundle {result.bundle_serial})", result)


def _reports_table(title: str, result: CollectResult) -> None:
    rows: list[tuple[object, ...]] = []
    for rep in result.reports:
        if not rep.ok:
            kept = "demand dropped" if rep.dropped else "last demand kept"
            rows.append((rep.source, "", "", f"unavailable ({kept}): {rep.error}"))
            continue
        for contract, units in sorted(rep.units.items()):
            rows.append((rep.source, contract, units, ""))
        if rep.unmatched_count:
            first = rep.unmatched[0]
            rows.append(
                (
                    rep.source,
                    "(none)",
                    "",
                    f"{rep.unmatched_count} unmatched, e.g. {first.ref}: {first.reason}",
                )
            )
        if not rep.units and not rep.unmatched_count:
            rows.append((rep.source, "", 0, f"{rep.pending} pending"))
    table(title, ["source", "contract", "units", "note"], rows)


def demand_intake(region: str = RegionOpt, json_out: bool = JsonOpt) -> None:
    """The region's demand intake: its last round per source, and whom it woke."""
    from activities.demand.intake import CollectResult
    from workflows.intake.models import IntakeStatus, intake_workflow_id

    s = settings()
    r = region or s.region

    async def go() -> IntakeStatus:
        client = await temporal_client(s, r)
        st: IntakeStatus = await client.get_workflow_handle(intake_workflow_id(r)).query(
            "status", result_type=IntakeStatus
        )
        return st

    status = run_temporal(go())
    wid = intake_workflow_id(r)
    if json_out:
        print_json({**status.model_dump(mode="json"), "ui_url": workflow_url(s, r, wid)})
        return
    last = status.last
    if last is None:
        console.print(f"intake {r}: no round yet")
        print_workflow_link(s, r, wid)
        return
    console.print(
        f"intake {r}: round {last.round} at {last.at:%H:%M:%S} (bundle {last.bundle_serial})"
        + (f" [red]{last.problem}[/]" if last.problem else "")
    )
    print_workflow_link(s, r, wid)
    _reports_table(
        f"last round in {r}",
        CollectResult(bundle_serial=last.bundle_serial, reports=last.reports),
    )
    if last.changed:
        console.print(f"changed: {', '.join(last.changed)}; woke {', '.join(last.signalled)}")
    if last.not_running:
        console.print(f"[yellow]not running:[/] {', '.join(last.not_running)}")
    for source, since in sorted(status.failing_since.items()):
        console.print(f"[yellow]{source} unreadable since {since:%Y-%m-%d %H:%M:%S}[/]")


def demand_collect(region: str = RegionOpt) -> None:
    """Have the region's intake read its sources now instead of at its next round."""
    from workflows.intake.models import CollectNow, intake_workflow_id

    s = settings()
    r = region or s.region

    async def go() -> None:
        client = await temporal_client(s, r)
        await client.get_workflow_handle(intake_workflow_id(r)).signal("collect_now", CollectNow())

    run_temporal(go())
    console.print(f"asked {intake_workflow_id(r)} to collect now")
    print_workflow_link(s, r, intake_workflow_id(r))
