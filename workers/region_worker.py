"""The region worker: one process per replica, serving one region's task queue."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
from datetime import timedelta

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.fleet.activities import FleetActivities
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository
from activities.provider.activities import ProviderActivities, all_activities
from workers.provider_factory import provider_for
from workers.settings import Settings
from workflows.sync_pools import SyncPoolsWorkflow

log = logging.getLogger(__name__)

WORKFLOWS = [SyncPoolsWorkflow]


async def connect(settings: Settings, region: str) -> Client:
    return await Client.connect(
        settings.temporal.address,
        namespace=settings.temporal.namespace(region),
        data_converter=pydantic_data_converter,
    )


async def run_worker(settings: Settings, region: str) -> None:
    client = await connect(settings, region)
    pool = open_pool(settings.postgres_dsn)
    fleet = FleetActivities(FleetRepository(pool), settings.regions_dir)
    cloud = ProviderActivities(provider_for(settings, region))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as executor:
        worker = Worker(
            client,
            task_queue=settings.temporal.task_queue(region),
            workflows=WORKFLOWS,
            activities=[
                fleet.sync_pools,
                fleet.record_acquire,
                fleet.record_event,
                *all_activities(cloud),
            ],
            activity_executor=executor,
            graceful_shutdown_timeout=timedelta(seconds=20),
        )
        log.info("worker for %s on %s", region, settings.temporal.task_queue(region))
        async with worker:
            await stop.wait()
    pool.close()
