"""Shared CLI plumbing: settings, error exits, tables, and the clients a command opens.

Imports here stay light (typer, rich, settings): every command loads this module, and the
database and Temporal clients are imported by the helpers that open them.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from workers.logs import configure_owned
from workers.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool
    from temporalio.client import Client
    from temporalio.runtime import Runtime

    from contracts.region import Region

T = TypeVar("T")

# Tables stay readable when piped: rich would otherwise assume 80 columns.
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def settings(**overrides: Any) -> Settings:
    try:
        s = load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except SettingsError as exc:
        fail(str(exc))
    configure_owned(s.log)
    return s


def known_region(s: Settings, name: str | None) -> str:
    """NAME (default: the settings' region) when it is a configured region, else a one-line
    error listing them: a typo never reaches Temporal as a missing namespace."""
    region = name or s.region
    if region not in s.regions:
        fail(f"unknown region {region} (known: {', '.join(s.regions)})")
    return region


def region_or_exit(s: Settings, name: str | None) -> Region:
    """The region NAME (default: the settings' region) from its file, or a one-line error."""
    from contracts.region import RegionFileError, load_region

    try:
        return load_region(s.region_file(name or s.region))
    except (RegionFileError, FileNotFoundError) as exc:
        fail(str(exc))


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    t = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        t.add_column(col)
    for row in rows:
        t.add_row(*("" if v is None else str(v) for v in row))
    console.print(t)


def print_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def workflow_url(s: Settings, region: str, workflow_id: str) -> str:
    """The workflow's page in the Temporal UI (`temporal.ui_url`), in the region's namespace."""
    from urllib.parse import quote

    namespace = quote(s.temporal.namespace(region), safe="")
    return (
        f"{s.temporal.effective_ui_url()}/namespaces/{namespace}"
        f"/workflows/{quote(workflow_id, safe='')}"
    )


def print_workflow_link(s: Settings, region: str, workflow_id: str) -> None:
    """`  Temporal UI: <url>` under a line that names the workflow; never wrapped, so a
    terminal keeps the link clickable."""
    console.print(
        f"  Temporal UI: {workflow_url(s, region, workflow_id)}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def print_workflow_urls(s: Settings, region: str, workflow_ids: Sequence[str]) -> None:
    """`<id>: <url>` per workflow, under a table that lists them (a column would be too wide)."""
    for wid in workflow_ids:
        console.print(
            f"{wid}: {workflow_url(s, region, wid)}", markup=False, highlight=False, soft_wrap=True
        )


@contextmanager
def fleet_db(s: Settings) -> Iterator[ConnectionPool]:
    """A one-connection pool on fleet state for one command, closed after; a database
    error is a one-line error and a non-zero exit.

    One plain connection first, with a short timeout: a server that is down is one line
    naming it and the cause within seconds, not the pool's retries and warnings."""
    import psycopg

    from activities.fleet.db import open_pool
    from workers.client_security import postgres_conninfo

    conninfo = postgres_conninfo(s)
    info = psycopg.conninfo.conninfo_to_dict(s.postgres_dsn)
    where = f"{info.get('host') or 'localhost'}:{info.get('port') or 5432}"
    try:
        psycopg.connect(conninfo, connect_timeout=3).close()
    except psycopg.Error as exc:
        cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        fail(f"PostgreSQL at {where} does not answer: {cause}")
    with errors_as_exit(psycopg.Error):
        pool = open_pool(conninfo, max_size=1, timeouts=s.fleet_db.timeouts())
        try:
            yield pool
        finally:
            pool.close()


@contextmanager
def errors_as_exit(*types: type[BaseException]) -> Iterator[None]:
    """Turn expected failures into a one-line error and a non-zero exit."""
    try:
        yield
    except types as exc:
        fail(str(exc))


# The Temporal clients a command opened, and their runtime: dropped before the interpreter
# finalizes (run_temporal), so the runtime's Rust threads stop while Python is still whole
# instead of touching a finalizing interpreter (the PyGILState_Release abort at exit).
_clients: list[Client] = []
_runtime: list[Runtime] = []


def run_temporal(coro: Awaitable[T]) -> T:
    """Run a Temporal client call; its RPC and update failures become one-line errors.
    The clients it opened are closed afterwards, whatever happened."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.exceptions import ApplicationError
    from temporalio.service import RPCError

    async def go() -> T:
        return await coro

    try:
        return asyncio.run(go())
    except RPCError as exc:
        fail(f"Temporal: {exc.message or exc}")
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        fail(cause.message if isinstance(cause, ApplicationError) else str(cause or exc))
    finally:
        close_temporal()


def close_temporal() -> None:
    """Drop every client and then the runtime (its threads end with it), now."""
    _clients.clear()
    _runtime.clear()
    gc.collect()


async def temporal_client(s: Settings, region: str) -> Client:
    """The region's Temporal client, or a one-line error naming the address. An unknown
    region is refused before any connection."""
    from temporalio.runtime import Runtime, TelemetryConfig

    from workers.temporal_connect import connect

    region = known_region(s, region)
    if not _runtime:
        # The command's own runtime (no metrics, no telemetry threads), not the process-wide
        # default, which lives until the interpreter's end.
        _runtime.append(Runtime(telemetry=TelemetryConfig(metrics=None)))
    try:
        client = await connect(s, region, runtime=_runtime[0])
    except RuntimeError as exc:
        fail(f"cannot reach Temporal at {s.temporal.address}: {exc}")
    _clients.append(client)
    return client
