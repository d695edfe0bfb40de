"""`sco temporal`: namespace and search-attribute bootstrap."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import typer

from workers.cli.common import console, fail, print_json, settings, table
from workers.temporal_bootstrap import bootstrap_namespace
from workers.temporal_connect import connect_temporal

app = typer.Typer(help="Temporal set-up for a region.", no_args_is_help=True)


@app.command()
def bootstrap(
    region: list[str] = typer.Option(None, "--region", help="Region(s); default all configured."),
    json_out: bool = typer.Option(False, "--json", help="The answer as JSON."),
) -> None:
    """Create the region's namespace (with retention) and register our search attributes.

    Idempotent: a second run changes nothing."""
    from workers.cli.bounds import DEADLINE_SECONDS
    from workers.cli.common import known_region

    s = settings()
    regions = [known_region(s, r) for r in region] if region else s.regions

    async def run() -> list[list[str]]:
        try:
            client = await asyncio.wait_for(connect_temporal(s), DEADLINE_SECONDS)
        except TimeoutError:
            fail(f"temporal at {s.temporal.address} did not answer within {DEADLINE_SECONDS:g} s")
        except Exception as exc:  # connection errors come in several types
            fail(f"temporal at {s.temporal.address} does not answer: {str(exc).splitlines()[0]}")
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
        return rows

    rows = asyncio.run(run())
    if json_out:
        keys = ("namespace", "namespace_state", "search_attributes_added")
        print_json([dict(zip(keys, row, strict=True)) for row in rows])
        return
    table("Temporal bootstrap", ["namespace", "namespace", "search attributes added"], rows)
    console.print("done")
