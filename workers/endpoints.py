"""The HTTP endpoints every long-running SCO process serves, each on a port of its own
settings key (0 turns it off):

- metrics: Prometheus text from prometheus_client's registry (`start_metrics`);
- health: `/healthz` (the process serves) and `/readyz` (its dependencies answer: the
  Temporal worker polls, the relay reaches fleet state and Kafka, ...). Kubernetes probes
  and the box's Prometheus call these. `serve_health` for asyncio processes,
  `health_thread` for the threaded ones (outbox relay, ledger consumer).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import Gauge, start_http_server

#: What a process's readiness is made of, one series per dependency it checks.
DEPENDENCY_UP = Gauge("sco_dependency_up", "1 while the dependency answers", ["dependency"])

_REASONS = {200: "OK", 503: "Service Unavailable", 404: "Not Found"}


class PortInUse(OSError):
    """A port a process must serve on is taken; the message names the setting."""


def start_metrics(port: int, *, setting: str) -> None:
    """Serve the process's prometheus_client registry on `port` (0: not at all). A port in
    use says which setting chose it: a bare "[Errno 98] Address already in use" from a
    process with four ports does not."""
    if not port:
        return
    try:
        start_http_server(port)
    except OSError as exc:
        raise PortInUse(
            f"{setting}={port}: {exc.strerror} (choose another, or 0 for none)"
        ) from exc


def _answer(path: bytes, ready: Callable[[], bool]) -> tuple[int, bytes]:
    if path == b"/healthz":
        return 200, b"ok\n"
    if path == b"/readyz":
        return (200, b"ready\n") if ready() else (503, b"not ready\n")
    return 404, b"not found\n"


async def serve_health(host: str, port: int, ready: Callable[[], bool]) -> asyncio.AbstractServer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), timeout=5)
            path = request.split(b" ")[1] if request.count(b" ") >= 2 else b"/"
            code, body = _answer(path, ready)
            writer.write(
                f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port)


class HealthThread:
    """`/healthz` and `/readyz` from a daemon thread; `close` stops it."""

    def __init__(self, host: str, port: int, ready: Callable[[], bool]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code, body = _answer(self.path.encode(), ready)
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                """Probes every few seconds would flood the process's log."""

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="health", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def health_thread(port: int, ready: Callable[[], bool]) -> HealthThread | None:
    """A health endpoint on `port` for a threaded process (0: none)."""
    return HealthThread("0.0.0.0", port, ready) if port else None
