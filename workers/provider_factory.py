"""The region's CloudProvider, as the settings choose it, closed when the process is done."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from activities.provider.interface import CloudProvider
from workers.client_security import (
    nats_options,
)
from workers.settings import Settings


@asynccontextmanager
async def open_provider(settings: Settings, region: str) -> AsyncIterator[CloudProvider]:
    """The provider for `region`; its connection (NATS or OpenStack) is closed on exit."""
    if settings.provider.kind == "openstack":
        from activities.provider.openstack import OpenStackProvider

        openstack = OpenStackProvider.from_cloud(
            settings.provider.openstack_cloud,
            image=settings.provider.image,
            network=settings.provider.network,
        )
        try:
            yield openstack
        finally:
            await openstack.close()
        return
    from activities.provider.sim_service import SimulatorClient

    simulator = SimulatorClient(
        settings.nats_url,
        region,
        prefix=settings.provider.simulator_prefix,
        connect_options=nats_options(settings),
    )
    try:
        yield simulator
    finally:
        await simulator.close()
