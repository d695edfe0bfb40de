"""Tracing's exporter (workers/tracing.py): off by default; with `tracing.otlp_endpoint`
the spans reach that OTLP/HTTP endpoint (a local HTTP server standing in for a collector)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from workers import tracing
from workers.settings import Settings, TracingSettings
from workflows.tracing import SignalTracingInterceptor


class _Collector(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    server.shutdown()
    server.server_close()


@pytest.fixture
def fresh_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider is one per process; this test makes its own."""
    monkeypatch.setattr(tracing, "_provider", None)


def test_tracing_is_off_by_default() -> None:
    assert Settings().tracing.otlp_endpoint == ""
    assert tracing.interceptors(Settings().tracing, "worker") == []


def test_spans_reach_the_otlp_endpoint(collector: str, fresh_provider: None) -> None:
    settings = TracingSettings(otlp_endpoint=collector)
    (interceptor,) = tracing.interceptors(settings, "worker")
    assert isinstance(interceptor, SignalTracingInterceptor)
    with interceptor.tracer.start_as_current_span("probe"):
        pass
    tracing.flush()
    assert _Collector.received, "no export reached the collector"
    path, body = _Collector.received[-1]
    assert path == "/v1/traces"
    request = ExportTraceServiceRequest.FromString(body)
    (resource,) = request.resource_spans
    service = {a.key: a.value.string_value for a in resource.resource.attributes}
    assert service["service.name"] == "sco-worker"
    assert [s.name for ss in resource.scope_spans for s in ss.spans] == ["probe"]
