"""A client of one region's namespace, with SCO's data converter: for the worker, the relay
and the CLI. Nothing heavier than the Temporal client is imported here."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime

from workers.settings import Settings


async def connect(settings: Settings, region: str, runtime: Runtime | None = None) -> Client:
    return await Client.connect(
        settings.temporal.address,
        namespace=settings.temporal.namespace(region),
        data_converter=pydantic_data_converter,
        runtime=runtime,
    )
