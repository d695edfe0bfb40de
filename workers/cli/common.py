"""Shared CLI plumbing: settings, error exits, tables."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import psycopg
import typer
from psycopg_pool import ConnectionPool
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from activities.fleet.db import open_pool
from contracts.region import Region, RegionFileError, load_region
from workers.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    from temporalio.client import Client

T = TypeVar("T")

# Tables stay readable when piped: rich would otherwise assume 80 columns.
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def settings(**overrides: Any) -> Settings:
    try:
        return load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except SettingsError as exc:
        fail(str(exc))


def region_or_exit(s: Settings, name: str | None) -> Region:
    """The region NAME (default: the settings' region) from its file, or a one-line error."""
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


@contextmanager
def fleet_db(s: Settings) -> Iterator[ConnectionPool]:
    """A one-connection pool on fleet state for one command, closed after; a database
    error is a one-line error and a non-zero exit."""
    with errors_as_exit(psycopg.Error):
        pool = open_pool(s.postgres_dsn, max_size=1, timeouts=s.fleet_db.timeouts())
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


def run_temporal(coro: Awaitable[T]) -> T:
    """Run a Temporal client call; its RPC and update failures become one-line errors."""
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


async def temporal_client(s: Settings, region: str) -> Client:
    """The region's Temporal client, or a one-line error naming the address."""
    from workers.region_worker import connect

    try:
        return await connect(s, region)
    except RuntimeError as exc:
        fail(f"cannot reach Temporal at {s.temporal.address}: {exc}")
