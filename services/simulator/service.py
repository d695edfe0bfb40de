"""The simulated cloud service of one region (`sco sim serve`): the embedded default
provider, answering CloudProvider calls over NATS until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import nats

from activities.provider.sim_service import serve
from activities.provider.simulator import Faults, Latency, SimulatedCloud
from contracts.redact import mask_credentials
from contracts.region import Region
from workers.client_security import nats_options
from workers.endpoints import serve_health, start_metrics
from workers.settings import Settings
from workers.shutdown import async_stop_event

log = logging.getLogger(__name__)


async def run(
    settings: Settings,
    region: Region,
    *,
    latency: Latency | None = None,
    faults: Faults | None = None,
) -> None:
    """Serve `region`'s simulated cloud until stopped; the NATS connection is closed after."""
    cloud = SimulatedCloud(
        region,
        latency=latency or Latency(),
        faults=faults or Faults(),
        clock=asyncio.get_running_loop().time,
    )
    with async_stop_event() as stop:
        nc = await nats.connect(settings.nats_url, **nats_options(settings))
        start_metrics(
            settings.provider.simulator_metrics_port, setting="SCO_PROVIDER__SIMULATOR_METRICS_PORT"
        )
        health = None
        if settings.provider.simulator_health_port:
            health = await serve_health(
                "0.0.0.0", settings.provider.simulator_health_port, lambda: nc.is_connected
            )
        try:
            serving = asyncio.create_task(
                serve(cloud, nc, prefix=settings.provider.simulator_prefix)
            )
            log.info(
                "simulated cloud for %s on NATS %s", region.id, mask_credentials(settings.nats_url)
            )
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
            for task in (serving, stopped):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving  # re-raises a failure of the service itself
        finally:
            if health is not None:
                health.close()
            await nc.close()
    log.info("simulated cloud for %s stopped", region.id)
