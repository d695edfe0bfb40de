"""`sco sim`: the simulated cloud (the embedded default provider)."""

from __future__ import annotations

import asyncio

import nats
import typer

from workers.cli import estate, estate_lifecycle
from workers.cli.common import errors_as_exit, region_or_exit, settings

sim_app = typer.Typer(
    help="The simulated cloud (the embedded default provider).", no_args_is_help=True
)


sim_app.command("estate")(estate.sim_estate)
sim_app.command("trace")(estate.sim_trace)
sim_app.command("evaluate")(estate.sim_evaluate)
sim_app.command("lifecycle")(estate_lifecycle.sim_lifecycle)


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
    from services.registry import service
    from workers.cli import bounds

    s = settings()
    region_model = region_or_exit(s, region)
    bounds.finite("--api-latency-ms", api_latency_ms, low=0, high=60_000)
    bounds.finite("--boot-seconds", boot_seconds, low=0, high=3600)
    bounds.finite("--rate-limit", rate_limit, low=0, high=1)
    bounds.finite("--server-errors", server_errors, low=0, high=1)
    with errors_as_exit(nats.errors.Error, OSError):
        asyncio.run(
            service("simulator").load()(
                s,
                region_model,
                latency=Latency(api_s=api_latency_ms / 1000, boot_s=boot_seconds),
                faults=Faults(rate_limit=rate_limit, server_error=server_errors),
            )
        )
