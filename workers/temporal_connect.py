"""A client of one region's namespace, with SCO's data converter: for the worker, the relay
and the CLI. Nothing heavier than the Temporal client is imported here."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.runtime import Runtime

from workers.client_security import connect_temporal
from workers.settings import Settings


async def connect(settings: Settings, region: str, runtime: Runtime | None = None) -> Client:
    """The region's namespace, over TLS with the client certificate when set."""
    return await connect_temporal(settings, settings.temporal.namespace(region), runtime)
