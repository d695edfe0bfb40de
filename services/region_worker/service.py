"""The region worker: one process per replica, serving one region's task queue.

It hosts every workflow and activity of the region, exposes Prometheus metrics (Temporal's
runtime telemetry, which also carries SCO's own counters from workflow and activity metric
meters) and a health endpoint, makes sure the region's controllers and token budget run,
and on SIGTERM stops polling and lets running activities finish (graceful shutdown).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from psycopg_pool import ConnectionPool
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion, WorkflowIDConflictPolicy
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import Worker, WorkerDeploymentConfig

from activities.budget import BudgetActivities
from activities.control.activities import ControlActivities
from activities.control.exact_plan import warm_up
from activities.demand.intake import DemandIntakeActivities
from activities.exclusion.activities import ExclusionActivities, exclusion_activities
from activities.fleet.activities import FleetActivities, SyncPoolsInput
from activities.fleet.control_state import ControlRepository
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository
from activities.floor.activities import FloorActivities
from activities.floor.models import floor_workflow_id
from activities.ledger.store import LedgerStore
from activities.lifecycle.activities import LifecycleActivities
from activities.lifecycle.models import lifecycle_workflow_id
from activities.provider.activities import ProviderActivities, all_activities
from activities.provider.interface import CloudProvider
from activities.reconciler.activities import ReconcilerActivities, reconciler_activities
from contracts.bundle import installed_bundle
from contracts.redact import mask_credentials
from services.region_worker.configs import configs_from
from services.region_worker.metrics import RegionCollector
from workers import cert_renewal
from workers.client_security import (
    ledger_options,
    nats_options,
    postgres_conninfo,
)
from workers.demand_sources import sources_for
from workers.endpoints import serve_health, start_metrics
from workers.logs import prepare_temporal_logging, temporal_core_logging
from workers.notice_hooks import NoticeHookConsumer, tell_notices
from workers.provider_factory import open_provider
from workers.settings import Settings
from workers.shutdown import async_stop_event
from workers.temporal_connect import connect
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.budget.workflow import TokenBudgetWorkflow
from workflows.controller.models import ControllerInput, controller_workflow_id
from workflows.controller.workflow import RegionControllerWorkflow
from workflows.exclusion.workflow import PoolExclusionWorkflow
from workflows.floor.models import FloorInput
from workflows.floor.workflow import FloorKeeperWorkflow
from workflows.intake.models import IntakeInput, intake_workflow_id
from workflows.intake.workflow import DemandIntakeWorkflow
from workflows.lifecycle.models import LifecycleInput
from workflows.lifecycle.workflow import LifecycleWorkflow
from workflows.reconciler.models import ReconcilerInput, reconciler_workflow_id
from workflows.reconciler.workflow import ReconcilerWorkflow
from workflows.slurm.workflow import SlurmReleaseWorkflow
from workflows.sync_pools import SyncPoolsWorkflow

log = logging.getLogger(__name__)

WORKFLOWS = [
    SyncPoolsWorkflow,
    AcquisitionWorkflow,
    RegionControllerWorkflow,
    TokenBudgetWorkflow,
    FloorKeeperWorkflow,
    PoolExclusionWorkflow,
    ReconcilerWorkflow,
    DemandIntakeWorkflow,
    SlurmReleaseWorkflow,
    LifecycleWorkflow,
]


async def sync_pool_catalogue(client: Client, settings: Settings, region: str) -> None:
    """The region file's pools into fleet state, as `sco pools sync` does (idempotent)."""
    out = await client.execute_workflow(
        SyncPoolsWorkflow.run,
        SyncPoolsInput(region=region),
        id=f"sync-pools-{region}-{uuid.uuid4().hex[:8]}",
        task_queue=settings.temporal.task_queue(region),
        execution_timeout=timedelta(minutes=2),
    )
    log.info("pools of %s: %d in fleet state, %d changed", region, out.pools, out.changed)


async def ensure_floor_keepers(client: Client, settings: Settings, region: str) -> list[str]:
    """Start a floor keeper per tier-1 contract with a floor in the region; idempotent.
    Without an installed bundle there is nothing to keep (the controllers say so)."""
    bundle, _ = installed_bundle(settings.bundle_cache_dir, settings.trust_dir)
    if bundle is None:
        return []
    started = []
    for contract in sorted(
        c.name for c in bundle.content.contracts if c.tier == 1 and c.floor.get(region, 0) > 0
    ):
        handle = await client.start_workflow(
            FloorKeeperWorkflow.run,
            FloorInput(region=region, contract=contract),
            id=floor_workflow_id(region, contract),
            task_queue=settings.temporal.task_queue(region),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        started.append(handle.id)
    return started


async def ensure_reconciler(client: Client, settings: Settings, region: str) -> list[str]:
    """Start the region's reconciler unless it runs; idempotent."""
    handle = await client.start_workflow(
        ReconcilerWorkflow.run,
        ReconcilerInput(region=region, config=configs_from(settings).reconciler),
        id=reconciler_workflow_id(region),
        task_queue=settings.temporal.task_queue(region),
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return [handle.id]


async def ensure_intake(client: Client, settings: Settings, region: str) -> list[str]:
    """Start the region's demand intake when a scheduler source is on; idempotent."""
    if not (settings.slurm.pending_demand or settings.kubernetes.pending_demand):
        return []
    handle = await client.start_workflow(
        DemandIntakeWorkflow.run,
        IntakeInput(
            region=region,
            config=configs_from(settings).intake,
        ),
        id=intake_workflow_id(region),
        task_queue=settings.temporal.task_queue(region),
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return [handle.id]


async def ensure_lifecycle(client: Client, settings: Settings, region: str) -> list[str]:
    """Start the region's lifecycle workflow when `lifecycle.enabled`; idempotent (a running
    one keeps its pauses and state)."""
    if not settings.lifecycle.enabled:
        return []
    handle = await client.start_workflow(
        LifecycleWorkflow.run,
        LifecycleInput(region=region, config=configs_from(settings).lifecycle),
        id=lifecycle_workflow_id(region),
        task_queue=settings.temporal.task_queue(region),
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return [handle.id]


def nats_connector(settings: Settings) -> Callable[[], Awaitable[NatsClient]]:
    """A fresh NATS connection per call (the lifecycle's drain requests, a few an hour),
    as this process's identity, failing fast when NATS is away."""

    async def connect() -> NatsClient:
        return await nats.connect(
            settings.nats_url,
            connect_timeout=5,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            **nats_options(settings),
        )

    return connect


async def ensure_controllers(client: Client, settings: Settings, region: str) -> list[str]:
    """Start the region's controller partitions that are not running; idempotent."""
    started = []
    configs = configs_from(settings).controller
    for partition in range(settings.control.partitions):
        handle = await client.start_workflow(
            RegionControllerWorkflow.run,
            ControllerInput(region=region, partition=partition, config=configs),
            id=controller_workflow_id(region, partition),
            task_queue=settings.temporal.task_queue(region),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        started.append(handle.id)
    return started


def build_activities(
    settings: Settings,
    region: str,
    client: Client,
    *,
    pool: ConnectionPool,
    provider: CloudProvider,
    ledger: LedgerStore,
) -> list[Any]:
    """Every activity of the region worker, on clients the caller opened and closes."""
    fleet_repo = FleetRepository(pool)
    fleet = FleetActivities(fleet_repo, settings.regions_dir)
    cloud = ProviderActivities(provider)
    control = ControlActivities(
        fleet_repo,
        ControlRepository(pool),
        provider,
        regions_dir=settings.regions_dir,
        bundle_cache_dir=settings.bundle_cache_dir,
        trust_dir=settings.trust_dir,
        ledger=ledger,
        solver_threads=settings.worker.solver_threads,
    )
    floor = FloorActivities(
        fleet_repo,
        provider,
        regions_dir=settings.regions_dir,
        bundle_cache_dir=settings.bundle_cache_dir,
        trust_dir=settings.trust_dir,
    )
    exclusion = ExclusionActivities(pool)
    reconciler = ReconcilerActivities(fleet_repo, provider)
    intake = DemandIntakeActivities(
        sources_for(settings),
        ControlRepository(pool),
        lambda: installed_bundle(settings.bundle_cache_dir, settings.trust_dir),
    )
    lifecycle = LifecycleActivities(
        fleet_repo,
        ControlRepository(pool),
        provider,
        regions_dir=settings.regions_dir,
        bundle_cache_dir=settings.bundle_cache_dir,
        trust_dir=settings.trust_dir,
        nats_connect=nats_connector(settings),
        spread_max_pool_fraction=settings.control.spread_max_pool_fraction,
    )
    budget = BudgetActivities(
        client,
        settings.temporal.task_queue(region),
        rate_per_second=settings.control.budget_rate_per_second,
        burst=settings.control.budget_burst,
    )
    return [
        fleet.sync_pools,
        fleet.record_acquire,
        fleet.record_event,
        *all_activities(cloud),
        control.snapshot,
        control.greedy_plan,
        control.exact_plan,
        control.record_acquisition,
        control.record_decision,
        control.mark_surplus,
        floor.snapshot,
        floor.probe_halls,
        *exclusion_activities(exclusion),
        *reconciler_activities(reconciler),
        budget.ensure,
        intake.collect,
        lifecycle.snapshot,
        lifecycle.instance,
        lifecycle.unused_fallback_leases,
        lifecycle.tell_drain,
    ]


def deployment_config(settings: Settings, region: str) -> WorkerDeploymentConfig | None:
    """The worker's Temporal Worker Deployment version, or None when versioning is off.

    Every workflow type auto-upgrades: the long-lived entities (controllers, floor keepers,
    pool exclusions, the token budget) must follow the current version or old builds would
    never drain, and acquisitions follow too. So every logic change of any workflow goes
    behind `workflow.patched` (the recorded-history replay tests hold us to it).

    Per-type behaviours (`@workflow.defn(versioning_behavior=PINNED)` for the short
    acquisitions and pool syncs) are not used: temporalio 1.35 sends a declared behaviour
    on every workflow task completion, and the server rejects it from an unversioned worker
    ("versioning behavior cannot be specified without deployment options being set with
    versioned mode"), which would break `worker.versioning = false` (the box, the tests).
    A single run can still be pinned at start (`versioning_override=PinnedVersioningOverride`)."""
    w = settings.worker
    if not w.versioning:
        return None
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(w.deployment(region), w.effective_build_id()),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.AUTO_UPGRADE,
    )


def temporal_reconnect(
    settings: Settings,
    region: str,
    runtime: Runtime,
    worker: Worker,
    holders: list[Any],
) -> Callable[[Any], Awaitable[None]]:
    """After a certificate renewal: a new Temporal client (the SDK fixes TLS at connect)
    on the worker's runtime, handed to the Worker (its next polls and activity calls use
    it; what is in flight finishes on the old one) and to every object here holding the
    old one as `_client` (the budget activities, the state collector). Runs in the
    renewal thread; the connect runs on the worker's own loop."""
    loop = asyncio.get_running_loop()

    async def swap() -> None:
        new = await connect(settings, region, runtime, process="worker")
        worker.client = new
        seen: set[int] = set()
        for h in holders:
            obj = getattr(h, "__self__", h)
            if obj is None or id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(getattr(obj, "_client", None), Client):
                obj._client = new
        log.info("Temporal client reconnected with the renewed certificate")

    async def hook(_bundle: Any) -> None:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(swap(), loop))

    return hook


def worker_ledger(settings: Settings) -> LedgerStore:
    """The ledger the controllers' reclaim rates are read from. A short lock wait: the
    ledger consumer holds an embedded ledger in bursts, and a tick would rather plan with
    the last known rates than wait. An embedded ledger is read by a child process, so the
    engine never loads in the worker (decision 0037)."""
    return LedgerStore(
        settings.effective_ledger_dsn,
        lock_timeout=2.0,
        client_options=ledger_options(settings),
        reads_in_child=True,
    )


async def _warm_exact_planner() -> None:
    if not await asyncio.to_thread(warm_up):
        log.warning("no scipy on this worker: its ticks keep the greedy plan")


async def run(settings: Settings, region: str) -> None:
    """Serve the region's task queue until SIGTERM/SIGINT; everything opened here (the
    fleet-state pool, the provider, the ledger client, the health endpoint) is closed
    after, whatever ends the run."""
    prepare_temporal_logging(settings.log)
    runtime = Runtime(
        telemetry=TelemetryConfig(
            # The SDK core's own warnings in the process's log format, not raw on stderr.
            logging=temporal_core_logging(),
            metrics=PrometheusConfig(bind_address=f"0.0.0.0:{settings.worker.metrics_port}")
            if settings.worker.metrics_port
            else None,
        )
    )
    with async_stop_event() as stop:
        client = await connect(settings, region, runtime, process="worker")
        async with contextlib.AsyncExitStack() as opened:
            pool = open_pool(
                postgres_conninfo(settings),
                timeouts=settings.fleet_db.timeouts(),
                max_lifetime=cert_renewal.pool_max_lifetime(settings),
            )
            opened.callback(pool.close)
            provider = await opened.enter_async_context(open_provider(settings, region))
            ledger = worker_ledger(settings)
            opened.callback(ledger.close)
            activities = build_activities(
                settings, region, client, pool=pool, provider=provider, ledger=ledger
            )
            running = False
            if settings.worker.health_port:
                health = await serve_health("0.0.0.0", settings.worker.health_port, lambda: running)
                opened.callback(health.close)
            # Served from the start: a scrape answers while the first plans are made.
            start_metrics(
                settings.worker.state_metrics_port, setting="SCO_WORKER__STATE_METRICS_PORT"
            )
            executor = opened.enter_context(concurrent.futures.ThreadPoolExecutor(max_workers=16))
            worker = Worker(
                client,
                task_queue=settings.temporal.task_queue(region),
                workflows=WORKFLOWS,
                activities=activities,
                activity_executor=executor,
                graceful_shutdown_timeout=timedelta(
                    seconds=settings.worker.graceful_shutdown_seconds
                ),
                deployment_config=deployment_config(settings, region),
            )
            log.info(
                "worker for %s on %s (Temporal %s, fleet state %s, NATS %s)%s",
                region,
                settings.temporal.task_queue(region),
                mask_credentials(settings.temporal.address),
                mask_credentials(settings.postgres_dsn),
                mask_credentials(settings.nats_url),
                f" as {settings.worker.deployment(region)}.{settings.worker.effective_build_id()}"
                if settings.worker.versioning
                else "",
            )
            async with worker:
                running = True
                # The exact planner's imports load beside the first tasks, not inside the
                # first demand change's tick (activities/control/exact_plan.py: warm_up).
                warming = asyncio.create_task(_warm_exact_planner())
                if settings.worker.start_controllers:
                    # Floors and controllers plan against fleet state's pools: load the
                    # region's catalogue first, so a fresh box's first plans are not errors.
                    await sync_pool_catalogue(client, settings, region)
                    ids = await ensure_controllers(client, settings, region)
                    ids += await ensure_floor_keepers(client, settings, region)
                    ids += await ensure_intake(client, settings, region)
                    ids += await ensure_reconciler(client, settings, region)
                    ids += await ensure_lifecycle(client, settings, region)
                    log.info("running: %s", ", ".join(ids))
                # The relays' notices, told to the exclusion cycles and controllers.
                hooks = NoticeHookConsumer(
                    client,
                    region,
                    settings.temporal.task_queue(region),
                    settings.control.partitions,
                    call_timeout=settings.notice_relay.hook_timeout_seconds,
                )
                hooking = asyncio.create_task(tell_notices(settings, hooks, stop))
                collecting = None
                collector = None
                if settings.worker.state_metrics_port:
                    collector = RegionCollector(settings, region, client, pool)
                    collecting = asyncio.create_task(collector.run(stop))
                renewer = cert_renewal.current()
                if renewer is not None and settings.temporal.tls.client_cert_file:
                    renewer.add_hook(
                        temporal_reconnect(
                            settings, region, runtime, worker, [*activities, collector, hooks]
                        )
                    )
                await stop.wait()
                if collecting is not None:
                    await collecting
                # Not waited for: a notice being told when cancelled is not acknowledged,
                # so the stream hands it to a worker again (signals are idempotent).
                hooking.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await hooking
                await warming
                running = False
                log.info(
                    "stopping: no new tasks; running activities get %.0f s",
                    settings.worker.graceful_shutdown_seconds,
                )
