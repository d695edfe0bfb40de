"""The `sco` command."""

from __future__ import annotations

import logging

import typer

from workers.cli import (
    cloud,
    contracts,
    control,
    dev,
    exclusion,
    fleet,
    floor,
    ledger,
    reconcile,
    schedulers,
    temporal,
)

app = typer.Typer(
    help="SCO: the Spot Capacity Orchestrator control plane.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(dev.app, name="dev")
app.add_typer(temporal.app, name="temporal")
app.add_typer(fleet.db_app, name="db")
app.add_typer(fleet.pools_app, name="pools")
app.add_typer(fleet.instances_app, name="instances")
app.add_typer(fleet.outbox_app, name="outbox")
app.command("worker")(control.worker)
app.add_typer(control.demand_app, name="demand")
control.demand_app.command("sources")(schedulers.demand_sources)
control.demand_app.command("intake")(schedulers.demand_intake)
control.demand_app.command("collect")(schedulers.demand_collect)
app.add_typer(schedulers.slurm_app, name="slurm")
app.add_typer(control.acq_app, name="acquisitions")
app.add_typer(control.controller_app, name="controller")
app.add_typer(control.budget_app, name="budget")
app.add_typer(floor.floor_app, name="floor")
app.add_typer(floor.hall_app, name="hall")
app.add_typer(exclusion.pool_app, name="pool")
app.add_typer(ledger.app, name="ledger")
app.add_typer(contracts.app, name="contracts")
app.add_typer(cloud.sim_app, name="sim")
app.command("notice-relay")(cloud.notice_relay)
app.command("reclaim")(cloud.reclaim)
app.command("reconcile")(reconcile.reconcile)


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    app()
