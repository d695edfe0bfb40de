"""OpenTelemetry tracing of a process's Temporal calls, when `tracing.otlp_endpoint` is set.

Client and worker share one interceptor (a worker takes its client's): client calls
(start, signal, query, update) and every workflow and activity the worker runs make spans,
which go to the OTLP/HTTP endpoint in batches. Off by default: no exporter, no spans, and
nothing of the OpenTelemetry SDK imported.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from contracts.redact import mask_credentials

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from temporalio.client import Interceptor

    from workers.settings import TracingSettings

log = logging.getLogger(__name__)

_provider: TracerProvider | None = None


def tracer_provider(settings: TracingSettings, process: str) -> TracerProvider:
    """The process's provider, exporting to the OTLP endpoint (made once per process)."""
    global _provider
    if _provider is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        name = settings.service_name or f"sco-{process}"
        _provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
        _provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint))
        )
        log.info("traces of %s to %s", name, mask_credentials(settings.otlp_endpoint))
    return _provider


def interceptors(settings: TracingSettings, process: str) -> list[Interceptor]:
    """The Temporal client interceptors tracing needs: none when it is off."""
    if not settings.otlp_endpoint:
        return []
    from workflows.tracing import SignalTracingInterceptor

    return [SignalTracingInterceptor(tracer_provider(settings, process).get_tracer("sco"))]


def flush(timeout_seconds: float = 5.0) -> None:
    """Send the spans still batched (a CLI command ends without interpreter finalization)."""
    if _provider is not None:
        _provider.force_flush(int(timeout_seconds * 1000))
