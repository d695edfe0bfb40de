"""Shared CLI plumbing: settings, error exits, tables, and the clients a command opens.

Imports here stay light (typer, settings): every command loads this module, and the
database and Temporal clients are imported by the helpers that open them. rich loads when
a command first prints through `console`, `err_console` or `table` (a long-running
process and a `--json` answer never do: about 2 MB and 20 ms of CPU less each).
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

import typer

from contracts.redact import mask_credentials
from workers.cli.plain import shown as shown
from workers.logs import configure_owned
from workers.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool
    from rich.console import Console
    from temporalio.client import Client
    from temporalio.runtime import Runtime

    from contracts.region import Region

T = TypeVar("T")


class _LazyConsole:
    """A rich Console made on first use: importing rich is left to the commands that print
    through it. Attribute access goes to the real Console."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._real: Console | None = None

    def _console(self) -> Console:
        if self._real is None:
            from rich.console import Console

            # Tables stay readable when piped: rich would otherwise assume 80 columns.
            width = None if self._stderr or sys.stdout.isatty() else 140
            self._real = Console(stderr=self._stderr, width=width)
        return self._real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._console(), name)


console: Console = cast("Console", _LazyConsole(stderr=False))
err_console: Console = cast("Console", _LazyConsole(stderr=True))


def escape(text: str) -> str:
    """TEXT with rich's markup escaped (rich loads with the first use)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def fail(message: str, code: int = 1) -> NoReturn:
    # Errors name the DSN or URL that failed; never its password (contracts/redact.py).
    message = mask_credentials(message)
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
    """NAME (default, when not given: the settings' region) when it is a configured region,
    else a one-line error listing them: a typo never reaches Temporal as a missing
    namespace, and `--region ''` is an error, not the default."""
    region = s.region if name is None else name
    if region not in s.regions:
        fail(f"unknown region {shown(region)} (known: {', '.join(s.regions)})")
    return region


def region_or_exit(s: Settings, name: str | None) -> Region:
    """The region NAME (default: the settings' region) from its file, or a one-line error."""
    from contracts.region import RegionFileError, load_region

    region = known_region(s, name)
    try:
        return load_region(s.region_file(region))
    except (RegionFileError, FileNotFoundError) as exc:
        fail(str(exc))


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    from rich.table import Table

    t = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        t.add_column(col)
    for row in rows:
        t.add_row(*("" if v is None else mask_credentials(str(v)) for v in row))
    console.print(t)


def print_json(data: object) -> None:
    typer.echo(mask_credentials(json.dumps(data, indent=2, default=str)))


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


def start_region_workflows(
    s: Settings,
    region: str,
    ensure: Callable[[Client, Settings, str], Awaitable[list[str]]],
    *,
    json_out: bool,
    none_running: str = "",
) -> None:
    """`sco <controller|floor|lifecycle> start`: `ensure` starts what is not running (on a
    region a worker polls), then each workflow id with its Temporal UI link, or as JSON;
    `none_running` is said when there was nothing to start."""

    async def go() -> list[str]:
        client = await temporal_client(s, region)
        await require_worker(client, region)
        return await ensure(client, s, region)

    ids = run_temporal(go())
    if json_out:
        print_json([{"workflow_id": wid, "ui_url": workflow_url(s, region, wid)} for wid in ids])
        return
    if not ids and none_running:
        console.print(none_running)
    for wid in ids:
        console.print(f"running: {wid}")
        print_workflow_link(s, region, wid)


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


# Where the command's Temporal calls went (address, namespace, region, client), for the
# message when they do not answer in time.
_called: list[tuple[str, str, str, Client]] = []


def run_temporal(coro: Awaitable[T], deadline: float | None = None) -> T:
    """Run a Temporal client call within the CLI's deadline (`bounds.DEADLINE_SECONDS`);
    its RPC and update failures become one-line errors, and so does no answer in time,
    naming what did not answer (the server, or the region's worker). The clients it
    opened are closed afterwards, whatever happened."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.exceptions import ApplicationError
    from temporalio.service import RPCError

    from workers.cli.bounds import DEADLINE_SECONDS

    seconds = DEADLINE_SECONDS if deadline is None else deadline

    async def go() -> T:
        try:
            return await asyncio.wait_for(_awaited(coro), seconds)
        except TimeoutError:
            fail(await _no_answer(seconds))

    try:
        return asyncio.run(go())
    except RPCError as exc:
        fail(f"Temporal: {exc.message or exc}")
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        fail(cause.message if isinstance(cause, ApplicationError) else str(cause or exc))
    finally:
        close_temporal()


async def _awaited(coro: Awaitable[T]) -> T:
    return await coro


async def _no_answer(seconds: float) -> str:
    """What did not answer within SECONDS: the region's worker when none polls its task
    queue (a query or update waits for one), else the Temporal server."""
    if not _called:
        return f"Temporal did not answer within {seconds:g} s"
    address, namespace, region, client = _called[-1]
    try:
        polled = await asyncio.wait_for(_polled(client, region), 2)
    except Exception:  # the server itself does not answer: said below
        polled = None
    if polled is False:
        return no_worker_message(namespace, region)
    return f"Temporal at {address} (namespace {namespace}) did not answer within {seconds:g} s"


def no_worker_message(namespace: str, region: str) -> str:
    return (
        f"no worker polls namespace {namespace}'s task queue sco-{region}: "
        f"is the {region} worker running? (`sco worker --region {region}`)"
    )


async def _polled(client: Client, region: str) -> bool:
    """Whether a worker polls the region's workflow task queue (Temporal lists the pollers
    it saw in the last minutes: DescribeTaskQueue)."""
    from datetime import timedelta

    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    from workers.settings import TemporalSettings

    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=TemporalSettings().task_queue(region)),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        ),
        timeout=timedelta(seconds=3),
    )
    return bool(resp.pollers)


async def require_worker(client: Client, region: str) -> None:
    """A one-line error, before anything is started or asked, when no worker polls the
    region's task queue: a workflow started or updated there would wait for one (an
    update until the deadline, a start forever: half-applied)."""
    if not await _polled(client, region):
        fail(no_worker_message(client.namespace, region))


async def worker_runs(client: Client, region: str) -> bool:
    """Whether a worker polls the region's task queue (for a durable signal: said when not)."""
    return await _polled(client, region)


def close_temporal() -> None:
    """Drop every client and then the runtime (its threads end with it), now."""
    _called.clear()
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
        fail(f"cannot reach Temporal at {s.temporal.address}: {_first_line(str(exc))}")
    _clients.append(client)
    _called.append((s.temporal.address, client.namespace, region, client))
    return client


def _first_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[0] if lines else ""
