"""`sco sim`: the simulated cloud (the embedded default provider)."""

from __future__ import annotations

import asyncio

import nats
import typer

from workers.cli import estate
from workers.cli.common import errors_as_exit, region_or_exit, settings

sim_app = typer.Typer(
    help="The simulated cloud (the embedded default provider).", no_args_is_help=True
)


sim_app.command("estate")(estate.sim_estate)


@sim_app.command("serve")
def sim_serve(
    region: str = typer.Option(None),
    api_latency_ms: float = typer.Option(0.0, help="Added to every API call."),
    boot_seconds: float = typer.Option(2.0, help="Time from create to ACTIVE."),
    rate_limit: float = typer.Option(0.0, help="Probability a call gets HTTP 429."),
    server_errors: float = typer.Option(0.0, help="Probability a call gets HTTP 503."),
) -> None:
    """Serve a simulated cloud for the region over NATS until stopped (SIGTERM/Ctrl-C)."""
    from activities.provider.simulator import Faults, Latency
    from workers import simulator_service

    s = settings()
    region_model = region_or_exit(s, region)
    with errors_as_exit(nats.errors.Error, OSError):
        asyncio.run(
            simulator_service.run(
                s,
                region_model,
                latency=Latency(api_s=api_latency_ms / 1000, boot_s=boot_seconds),
                faults=Faults(rate_limit=rate_limit, server_error=server_errors),
            )
        )
