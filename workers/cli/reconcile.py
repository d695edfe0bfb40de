"""`sco reconcile --region r1 [--dry-run]`: one reconciler pass now, and what it found.

The pass runs as a one-shot ReconcilerWorkflow on the region's task queue (the region
worker's provider and its token budget, as the region's own reconciler every few
minutes); `--dry-run` finds and reports and changes nothing.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import typer

from workers.cli import bounds
from workers.cli.common import (
    console,
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
from workflows.reconciler.models import ReconcileReport, ReconcilerInput, reconciler_workflow_id
from workflows.reconciler.workflow import ReconcilerWorkflow

RECONCILE_SECONDS = 120.0


def reconcile(
    region: str = typer.Option(None, "--region", help="Region; default from settings."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Find and report; change nothing."),
    grace_seconds: float = typer.Option(
        None, "--grace-seconds", help="Leave younger orphans alone; default from settings."
    ),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Compare provider servers and leases with fleet state: delete orphans, mark ghosts."""
    from services.region_worker.configs import configs_from

    s = settings()
    r = known_region(s, region)
    cfg = configs_from(s).reconciler
    if grace_seconds is not None:
        bounds.finite("--grace-seconds", grace_seconds, low=0, high=30 * 86_400)
        cfg = cfg.model_copy(update={"grace_seconds": grace_seconds})

    wid = f"{reconciler_workflow_id(r)}-once-{uuid.uuid4().hex[:8]}"

    async def go() -> ReconcileReport:
        client = await temporal_client(s, r)
        await require_worker(client, r)
        return await client.execute_workflow(
            ReconcilerWorkflow.run,
            ReconcilerInput(region=r, config=cfg, dry_run=dry_run, once=True),
            id=wid,
            task_queue=s.temporal.task_queue(r),
            execution_timeout=timedelta(minutes=10),
        )

    # One pass lists the provider's servers and leases: longer than a query, still bounded.
    report = run_temporal(go(), deadline=RECONCILE_SECONDS)
    if json_out:
        print_json({**report.model_dump(mode="json"), "ui_url": workflow_url(s, r, wid)})
        return
    console.print(f"{wid}:")
    print_workflow_link(s, r, wid)
    verb = "would delete" if dry_run else "deleted"
    rows: list[tuple[str, str, str]] = []
    rows += [("orphan server", x, verb) for x in report.orphan_servers]
    rows += [("orphan lease", x, verb) for x in report.orphan_leases]
    rows += [("ghost", x, "would mark lost" if dry_run else "marked lost") for x in report.ghosts]
    rows += [("fallback lease in use", x, "renewed") for x in report.renewed]
    if not rows:
        console.print(f"{r}: provider and fleet state agree")
        return
    title = f"reconcile {r}" + (" (dry run: nothing changed)" if dry_run else "")
    table(title, ["what", "which", "action"], rows)
    if not dry_run:
        console.print(
            f"deleted {report.deleted_servers} server(s) and {report.deleted_leases} lease(s), "
            f"marked {report.marked_lost} instance(s) lost"
        )
