"""`sco temporal`: namespace and search-attribute bootstrap."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import typer

from workers.cli.common import console, fail, settings, table
from workers.temporal_bootstrap import bootstrap_namespace
from workers.temporal_connect import connect_temporal

app = typer.Typer(help="Temporal set-up for a region.", no_args_is_help=True)


@app.command()
def bootstrap(
    region: list[str] = typer.Option(None, "--region", help="Region(s); default all configured."),
) -> None:
    """Create the region's namespace (with retention) and register our search attributes.

    Idempotent: a second run changes nothing."""
    s = settings()
    regions = region or s.regions

    async def run() -> None:
        try:
            client = await connect_temporal(s)
        except Exception as exc:  # connection errors come in several types
            fail(f"temporal at {s.temporal.address} does not answer: {exc}")
        rows = []
        for r in regions:
            rep = await bootstrap_namespace(
                client, s.temporal.namespace(r), timedelta(days=s.temporal.retention_days)
            )
            rows.append(
                [
                    rep.namespace,
                    "created" if rep.namespace_created else "present",
                    ", ".join(rep.attributes_added) or "none",
                ]
            )
        table("Temporal bootstrap", ["namespace", "namespace", "search attributes added"], rows)

    asyncio.run(run())
    console.print("done")
