"""`sco db | pools | instances | outbox`: fleet state and the region's outbox relay."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import typer

from activities.events import InstanceState
from workers.cli import dead_letters
from workers.cli.common import (
    close_temporal,
    console,
    errors_as_exit,
    fail,
    fleet_db,
    known_region,
    print_json,
    region_or_exit,
    require_worker,
    settings,
    table,
    temporal_client,
)

if TYPE_CHECKING:
    from activities.fleet.activities import SyncPoolsOutput
    from activities.fleet.repository import FleetRepository

db_app = typer.Typer(help="Fleet-state database.", no_args_is_help=True)
pools_app = typer.Typer(help="Pools (hall x SKU x size) in fleet state.", no_args_is_help=True)
instances_app = typer.Typer(help="SCO-owned instances in fleet state.", no_args_is_help=True)
outbox_app = typer.Typer(help="The lifecycle-event outbox.", no_args_is_help=True)
outbox_app.command("dead-letters")(dead_letters.list_dead_letters)
outbox_app.command("retry")(dead_letters.retry)


@contextmanager
def _repo() -> Iterator[FleetRepository]:
    """Fleet state for one command; its connection closes after."""
    from activities.fleet.repository import FleetRepository

    with fleet_db(settings()) as db:
        yield FleetRepository(db)


JsonOpt = typer.Option(False, "--json", help="The answer as JSON (its schema: docs/reference.md).")


@db_app.command("migrate")
def db_migrate(json_out: bool = JsonOpt) -> None:
    """Apply pending migrations (a no-op when current)."""
    import psycopg

    from activities.fleet.migrate import current_version, ensure_database, migrate
    from workers.client_security import postgres_conninfo

    s = settings()
    with errors_as_exit(psycopg.Error, RuntimeError):
        dsn = postgres_conninfo(s)
        ensure_database(dsn)
        applied = migrate(dsn)
        version = current_version(dsn)
    if json_out:
        print_json({"applied": [f"{m.version:04d}_{m.name}" for m in applied], "version": version})
        return
    for m in applied:
        console.print(f"applied {m.version:04d}_{m.name}")
    console.print(f"schema at version {version}" + ("" if applied else " (already current)"))


@pools_app.command("sync")
def pools_sync(
    region: str = typer.Option(None, help="Region; default from settings."),
    json_out: bool = JsonOpt,
) -> None:
    """Load the region file's pools into fleet state, through the region's worker (refused
    when no worker polls the region's task queue: the sync would wait for one)."""
    from activities.fleet.activities import SyncPoolsInput, SyncPoolsOutput

    s = settings()
    r = known_region(s, region)

    async def run() -> SyncPoolsOutput:
        client = await temporal_client(s, r)
        await require_worker(client, r)
        out: SyncPoolsOutput = await client.execute_workflow(
            "SyncPoolsWorkflow",
            SyncPoolsInput(region=r),
            id=f"sync-pools-{r}-{uuid.uuid4().hex[:8]}",
            task_queue=s.temporal.task_queue(r),
            result_type=SyncPoolsOutput,
        )
        return out

    with console.status(f"syncing pools of {r} (is `sco worker --region {r}` running?)"):
        try:
            out = asyncio.run(asyncio.wait_for(run(), timeout=120))
        except TimeoutError:
            fail(
                f"no worker answered on {s.temporal.task_queue(r)} within 120 s; "
                f"start one with `sco worker --region {r}`"
            )
        except typer.Exit:
            raise
        except Exception as exc:  # Temporal client errors come in several types
            fail(f"sync failed: {exc}")
        finally:
            close_temporal()
    if json_out:
        print_json(out.model_dump(mode="json"))
        return
    console.print(f"region {out.region}: {out.pools} pools, {out.changed} changed")


@pools_app.command("list")
def pools_list(
    region: str = typer.Option(None),
    hall: str = typer.Option(None),
    json_out: bool = JsonOpt,
) -> None:
    """Pools with their capacity, price and live SCO instances."""
    s = settings()
    r = known_region(s, region)
    if hall is not None:
        halls = region_or_exit(s, r).halls
        if hall not in halls:
            fail(f"--hall {hall!r}: region {r} has halls {', '.join(halls)}")
    with _repo() as repo:
        rows = repo.list_pools(r, hall)
    if not rows:
        fail(f"no pools for region {r}; run `sco pools sync`")
    if json_out:
        print_json([p.model_dump(mode="json") for p in rows])
        return
    table(
        f"pools of {r}",
        ["pool", "vCPU", "GiB", "GPU", "price/h", "reclaimable", "live"],
        [
            [
                p.pool_id,
                p.vcpu,
                p.memory_gib,
                p.gpus,
                f"{p.price_per_hour:.3f}",
                p.reclaimable_units,
                p.live_instances,
            ]
            for p in rows
        ],
    )


@instances_app.command("list")
def instances_list(
    region: str = typer.Option(None),
    state: list[InstanceState] = typer.Option(None, help="Filter by state (repeatable)."),
    json_out: bool = JsonOpt,
) -> None:
    """SCO-owned instances and their lifecycle state; DRIFT says whether each still conforms
    to its contract in the installed bundle (`?`: no bundle installed)."""
    from workers.cli.explain import drift_of

    s = settings()
    r = known_region(s, region)
    with _repo() as repo:
        rows = repo.list_instances(r, state or None)
    drift = drift_of(s, rows)
    if json_out:
        print_json(
            [
                i.model_dump(mode="json")
                | {
                    "drifted": None if drift is None else i.instance_id in drift,
                    "drift_reason": (drift or {}).get(i.instance_id, ""),
                }
                for i in rows
            ]
        )
        return
    table(
        f"instances of {r}",
        ["instance", "pool", "capacity", "workload", "tier", "state", "since", "drift"],
        [
            [
                i.instance_id,
                i.pool_id,
                i.capacity_type.value,
                i.workload,
                i.tier,
                i.state.value,
                i.state_changed_at.isoformat(timespec="seconds"),
                "?" if drift is None else drift.get(i.instance_id, "-"),
            ]
            for i in rows
        ],
    )


@outbox_app.command("status")
def outbox_status(json_out: bool = JsonOpt) -> None:
    """How many lifecycle events wait for Kafka, and for how long."""
    with _repo() as repo:
        count, age = repo.outbox_backlog()
    if json_out:
        print_json({"waiting": count, "oldest_seconds": age})
        return
    console.print(f"{count} events waiting; oldest {age:.1f} s")


@outbox_app.command("relay")
def outbox_relay() -> None:
    """Publish committed lifecycle events to Kafka until stopped (SIGTERM/Ctrl-C)."""
    import psycopg

    from services.registry import service

    s = settings()
    with errors_as_exit(psycopg.Error):
        progress = service("outbox-relay").load()(s)
    console.print(f"relay stopped after {progress.published} events")
