"""The region's CloudProvider, as the settings choose it."""

from __future__ import annotations

from activities.provider.interface import CloudProvider
from workers.client_security import (
    nats_options,
)
from workers.settings import Settings


def provider_for(settings: Settings, region: str) -> CloudProvider:
    if settings.provider.kind == "openstack":
        from activities.provider.openstack import OpenStackProvider

        return OpenStackProvider.from_cloud(
            settings.provider.openstack_cloud,
            image=settings.provider.image,
            network=settings.provider.network,
        )
    from activities.provider.sim_service import SimulatorClient

    return SimulatorClient(
        settings.nats_url,
        region,
        prefix=settings.provider.simulator_prefix,
        connect_options=nats_options(settings),
    )
