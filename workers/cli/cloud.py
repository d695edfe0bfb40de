"""`sco sim | notice-relay | reclaim`: the simulated cloud, the hall's notice relay, and an
operator's reclaim."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import signal
from collections.abc import Awaitable, Callable
from datetime import timedelta

import nats
import typer
from nats.aio.msg import Msg
from temporalio.client import Client

from activities.events import CapacityType, InstanceState
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository, InstanceRow
from activities.notice_relay import NoticeRelay
from contracts.notice import ReclaimNotice, ReclaimRequest, reclaim_subject
from contracts.region import Region, RegionFileError, load_region
from workers.cli.common import console, fail, fleet_db, settings
from workers.provider_factory import provider_for
from workers.settings import Settings

sim_app = typer.Typer(
    help="The simulated cloud (the embedded default provider).", no_args_is_help=True
)


def _region(name: str | None) -> tuple[str, Region]:
    s = settings()
    region_id = name or s.region
    try:
        return region_id, load_region(s.region_file(region_id))
    except (RegionFileError, FileNotFoundError) as exc:
        fail(str(exc))


@sim_app.command("serve")
def sim_serve(
    region: str = typer.Option(None),
    api_latency_ms: float = typer.Option(0.0, help="Added to every API call."),
    boot_seconds: float = typer.Option(2.0, help="Time from create to ACTIVE."),
    rate_limit: float = typer.Option(0.0, help="Probability a call gets HTTP 429."),
    server_errors: float = typer.Option(0.0, help="Probability a call gets HTTP 503."),
) -> None:
    """Serve a simulated cloud for the region over NATS until stopped."""
    from activities.provider.sim_service import serve
    from activities.provider.simulator import Faults, Latency, SimulatedCloud

    s = settings()
    region_id, region_model = _region(region)

    async def run() -> None:
        cloud = SimulatedCloud(
            region_model,
            latency=Latency(api_s=api_latency_ms / 1000, boot_s=boot_seconds),
            faults=Faults(rate_limit=rate_limit, server_error=server_errors),
            clock=asyncio.get_running_loop().time,
        )
        nc = await nats.connect(s.nats_url)
        task = asyncio.create_task(serve(cloud, nc, prefix=s.provider.simulator_prefix))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        console.print(f"simulated cloud for {region_id} on NATS {s.nats_url}")
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await nc.close()

    asyncio.run(run())


def notice_relay(
    region: str = typer.Option(None),
    hall: str = typer.Option(..., help="The hall (A-D)."),
    sweep_seconds: float = typer.Option(1.0, help="How often deadlines are checked."),
) -> None:
    """Run the hall's notice relay: reclaims → notices with a deadline → deletes."""
    s = settings()
    region_id, region_model = _region(region)
    if hall not in region_model.halls:
        fail(f"--hall {hall}: region {region_id} has halls {', '.join(region_model.halls)}")
    lead = timedelta(seconds=region_model.notice_lead_seconds)

    async def run() -> None:
        nc = await nats.connect(s.nats_url)
        relay = NoticeRelay(
            region=region_id,
            hall=hall,
            lead=lead,
            repo=FleetRepository(open_pool(s.postgres_dsn, max_size=2)),
            provider=provider_for(s, region_id),
            js=nc.jetstream(),
            on_notice=_exclusion_notifier(s, region_id),
        )
        await relay.ensure_stream()
        console.print(f"notice relay {region_id}/{hall}: republished {await relay.recover()}")

        async def on_request(msg: Msg) -> None:
            try:
                notices = await relay.handle_request(ReclaimRequest.model_validate_json(msg.data))
                reply = f"{len(notices)} noticed: {', '.join(n.node for n in notices)}"
            except ValueError as exc:
                reply = f"error: {exc}"
            if msg.reply:
                await msg.respond(reply.encode())

        await nc.subscribe(reclaim_subject(region_id, hall), cb=on_request)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        while not stop.is_set():
            for notice in await relay.poll_provider():
                console.print(f"noticed {notice.node} (deadline {notice.deadline:%H:%M:%S})")
            for iid in await relay.sweep():
                console.print(f"deadline passed: deleted {iid}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), sweep_seconds)
        await nc.close()

    asyncio.run(run())


def _exclusion_notifier(s: Settings, region: str) -> Callable[[ReclaimNotice], Awaitable[None]]:
    """Tell the pool's exclusion cycle about each notice (signal-with-start). Temporal
    being down costs nothing here: the cycle's own periodic count catches up."""
    from workers.region_worker import connect
    from workflows.exclusion.client import notify_reclaim

    client: Client | None = None

    async def notify(notice: ReclaimNotice) -> None:
        nonlocal client
        if client is None:
            client = await connect(s, region)
        await notify_reclaim(
            client,
            region,
            s.temporal.task_queue(region),
            notice.pool_id,
            notice.node,
            notice.issued_at,
        )

    return notify


def _owners(rows: list[InstanceRow]) -> str:
    return ", ".join(sorted({f"{r.workload} via {r.acquisition_id or '?'}" for r in rows}))


def reclaim(
    target: str = typer.Argument(..., help="An instance name, or a pool id with --pool."),
    pool: bool = typer.Option(False, "--pool", help="TARGET is a pool: reclaim all of it."),
    reason: str = typer.Option("operator reclaim"),
    region: str = typer.Option(None),
    force: bool = typer.Option(
        False, "--force", help="Also reclaim committed capacity (a floor's, a fallback's)."
    ),
) -> None:
    """Ask the hall's notice relay to reclaim an instance or a whole pool.

    Committed instances (a tier-1 floor, a paid fallback) are refused unless --force: a
    reclaim there drops a floor below its size until the keeper has rebuilt it."""
    s = settings()
    region_id = region or s.region
    with fleet_db(s) as db:
        repo = FleetRepository(db)
        if pool:
            parts = target.split(".")
            if len(parts) != 4 or parts[0] != region_id:
                fail(f"{target}: a pool id is {region_id}.<hall>.<sku>.<size>")
            hall = parts[1]
            live = [InstanceState.ACTIVE, InstanceState.NOTICED, InstanceState.DRAINING]
            committed = [
                r
                for r in repo.list_instances(region_id, live, hall=hall)
                if r.pool_id == target and r.capacity_type is CapacityType.COMMITTED
            ]
            if committed and not force:
                fail(
                    f"{target}: holds {len(committed)} committed instance(s) "
                    f"({_owners(committed)}); refused without --force"
                )
            req = ReclaimRequest(pool_id=target, reason=reason, requested_by=getpass.getuser())
        else:
            row = repo.get_instance(target)
            if row is None:
                fail(f"{target}: no such instance in fleet state")
            if row.capacity_type is CapacityType.COMMITTED and not force:
                fail(
                    f"{target}: committed capacity ({_owners([row])}); a reclaim drops it "
                    "below its floor until rebuilt; refused without --force"
                )
            hall = row.hall
            req = ReclaimRequest(instances=[target], reason=reason, requested_by=getpass.getuser())

    async def run() -> str:
        nc = await nats.connect(s.nats_url)
        try:
            msg = await nc.request(
                reclaim_subject(region_id, hall), req.model_dump_json().encode(), timeout=15
            )
            return msg.data.decode()
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            fail(
                f"no notice relay answers for {region_id}/{hall}; start "
                f"`sco notice-relay --region {region_id} --hall {hall}`"
            )
        finally:
            await nc.close()

    console.print(asyncio.run(run()))
