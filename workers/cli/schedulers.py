"""`sco slurm ...` and `sco demand sources|intake|collect`: the schedulers as demand."""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

import typer

from workers.cli.common import (
    console,
    errors_as_exit,
    fail,
    fleet_db,
    known_region,
    print_json,
    print_workflow_link,
    require_worker,
    run_temporal,
    settings,
    shown,
    table,
    temporal_client,
    worker_runs,
    workflow_url,
)

if TYPE_CHECKING:
    from activities.demand.intake import CollectResult
    from workers.settings import Settings
    from workers.slurm_power_programs import Report
    from workflows.intake.models import IntakeStatus

# Imports of the scheduler, intake and Slurm code live in the commands: `sco demand set`
# loads this module (its `demand` group holds the commands below) and needs none of them.

slurm_app = typer.Typer(
    help="Slurm power saving: CLOUD nodes SCO brings up and releases.", no_args_is_help=True
)

RegionOpt = typer.Option(None, "--region", help="Region; default from settings.")
JsonOpt = typer.Option(False, "--json", help="The answer as JSON (its schema: docs/reference.md).")


# -- slurm -------------------------------------------------------------------------------


#: A hostlist as slurmctld passes it is compressed (`r1-a-gp-l-[1-16]`): long is a mistake.
HOSTLIST_MAX = 65_536
MAX_NODES = 100_000
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
    from workers.cli import bounds

    s = settings()
    r = known_region(s, region)
    bounds.whole("--nodes", nodes, low=1, high=10_000)
    bounds.whole("--suspend-time", suspend_time, low=1, high=86_400 * 365)
    partition = bounds.identifier("--partition", partition, max_len=64)
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


_NODE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _nodes(hostlist: str) -> list[str]:
    """The node names of HOSTLIST when each is a host name (as Slurm's CLOUD nodes are)."""
    from activities.demand.hostlist import HostlistError, expand
    from workers.cli import bounds

    bounds.text("HOSTLIST", hostlist, max_len=HOSTLIST_MAX)
    # Before expanding: `n[1-999999999]` would be a billion names.
    spans = [int(hi) - int(lo) + 1 for lo, hi in re.findall(r"(\d+)-(\d+)", hostlist)]
    if sum(abs(x) for x in spans) > MAX_NODES:
        fail(f"HOSTLIST: more than {MAX_NODES} nodes")
    try:
        nodes = expand(hostlist)
    except HostlistError as exc:
        fail(f"HOSTLIST: {exc}")
    bad = [n for n in nodes if not _NODE_NAME.fullmatch(n)]
    if bad:
        fail(f"HOSTLIST: {shown(bad[0])} is not a node name (letters, digits, '-'; at most 63)")
    return nodes


def _worker_polls(s: Settings) -> None:
    """Refused, before any acquisition is started or cancelled, when no worker polls the
    region's task queue: what starts now would wait for one (Slurm's own ResumeProgram,
    `sco-resume`, starts them all the same: the node waits, and Slurm times it out)."""
    r = known_region(s, None)

    async def check() -> None:
        await require_worker(await temporal_client(s, r), r)

    run_temporal(check())


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

    from workers.cli import bounds
    from workers.slurm_power_programs import ProgramError, resume

    _nodes(hostlist)
    if resume_file is not None:
        bounds.in_file("--resume-file", bounds.path_value(resume_file))
    s = settings()
    _worker_polls(s)
    with errors_as_exit(ProgramError, psycopg.Error):
        _show(run_temporal(resume(s, hostlist, resume_file=resume_file)), json_out)


@slurm_app.command("suspend")
def slurm_suspend(hostlist: str = typer.Argument(...), json_out: bool = JsonOpt) -> None:
    """What SuspendProgram does: release the instances behind the nodes."""
    import psycopg

    from workers.slurm_power_programs import ProgramError, release
    from workflows.slurm.models import ReleaseReason

    _nodes(hostlist)
    s = settings()
    _worker_polls(s)
    with errors_as_exit(ProgramError, psycopg.Error):
        _show(run_temporal(release(s, hostlist, ReleaseReason.SUSPEND)), json_out)


@slurm_app.command("resume-failed")
def slurm_resume_failed(hostlist: str = typer.Argument(...), json_out: bool = JsonOpt) -> None:
    """What ResumeFailProgram does: release, and count against the pools' exclusion."""
    import psycopg

    from workers.slurm_power_programs import ProgramError, release
    from workflows.slurm.models import ReleaseReason

    _nodes(hostlist)
    s = settings()
    _worker_polls(s)
    with errors_as_exit(ProgramError, psycopg.Error):
        _show(run_temporal(release(s, hostlist, ReleaseReason.RESUME_FAILED)), json_out)


@slurm_app.command("nodes")
def slurm_nodes(
    region: str = RegionOpt, all_: bool = typer.Option(False, "--all"), json_out: bool = JsonOpt
) -> None:
    """Instances behind Slurm nodes (live ones; --all: deleted and failed too)."""
    from activities.fleet.repository import FleetRepository

    s = settings()
    r = known_region(s, region)
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
    from contracts.bundle import installed_bundle
    from workers.demand_sources import sources_for

    s = settings()
    r = known_region(s, region)
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
    from workflows.intake.models import STATUS_QUERY, IntakeStatus, intake_workflow_id

    s = settings()
    r = known_region(s, region)

    async def go() -> IntakeStatus:
        client = await temporal_client(s, r)
        await require_worker(client, r)
        st: IntakeStatus = await client.get_workflow_handle(intake_workflow_id(r)).query(
            STATUS_QUERY, result_type=IntakeStatus
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


def demand_collect(region: str = RegionOpt, json_out: bool = JsonOpt) -> None:
    """Have the region's intake read its sources now instead of at its next round."""
    from workflows.intake.models import COLLECT_NOW_SIGNAL, CollectNow, intake_workflow_id

    s = settings()
    r = known_region(s, region)

    async def go() -> bool:
        client = await temporal_client(s, r)
        await client.get_workflow_handle(intake_workflow_id(r)).signal(
            COLLECT_NOW_SIGNAL, CollectNow()
        )
        return await worker_runs(client, r)

    worker = run_temporal(go())
    wid = intake_workflow_id(r)
    if json_out:
        print_json(
            {"workflow_id": wid, "worker_running": worker, "ui_url": workflow_url(s, r, wid)}
        )
        return
    if not worker:
        console.print(
            f"[yellow]note:[/] no worker polls {r}'s task queue: it collects when one runs"
        )
    console.print(f"asked {intake_workflow_id(r)} to collect now")
    print_workflow_link(s, r, intake_workflow_id(r))
