"""A Temporal client of one region's namespace, with SCO's data converter, over TLS with
the client certificate when set: for the worker, the relay and the CLI. Apart from
`client_security` because temporalio costs a process ~30 MB resident, and the processes
that never talk to Temporal (the ledger consumer, the outbox relay) import that one."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig

from workers.client_security import observe_client_cert, read_file
from workers.settings import Settings


async def connect(
    settings: Settings, region: str, runtime: Runtime | None = None, process: str = "cli"
) -> Client:
    """The region's namespace, over TLS with the client certificate when set."""
    return await connect_temporal(settings, settings.temporal.namespace(region), runtime, process)


async def connect_temporal(
    s: Settings,
    namespace: str = "default",
    runtime: Runtime | None = None,
    process: str = "cli",
) -> Client:
    """A Temporal client on `namespace`, over TLS (with the client certificate) when set,
    traced when `tracing.otlp_endpoint` is set (`process` names the traces' service)."""
    from workers import tracing

    return await Client.connect(
        s.temporal.address,
        namespace=namespace,
        data_converter=pydantic_data_converter,
        runtime=runtime,
        tls=temporal_tls(s),
        interceptors=tracing.interceptors(s.tracing, process),
    )


def temporal_tls(s: Settings) -> TLSConfig | bool:
    t = s.temporal.tls
    if not t.enabled:
        return False
    observe_client_cert(t.client_cert_file, "temporal.tls.client_cert_file")
    return TLSConfig(
        server_root_ca_cert=read_file(t.ca_file, "temporal.tls.ca_file") if t.ca_file else None,
        domain=t.server_name or None,
        client_cert=(
            read_file(t.client_cert_file, "temporal.tls.client_cert_file")
            if t.client_cert_file
            else None
        ),
        client_private_key=(
            read_file(t.client_key_file, "temporal.tls.client_key_file")
            if t.client_key_file
            else None
        ),
    )
