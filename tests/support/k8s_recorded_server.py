"""A recorded-response Kubernetes API server for tests: stdlib `http.server`, threaded.

Each recording under tests/data/k8s_recordings/ is one exchange:

    {"request": {"method": "GET", "path": "/api/v1/pods", "query": {"limit": "500", ...}},
     "response": {"status": 200, "body": {...}, "headers": {...}, "delay_seconds": 0}}

A request matches when method, path and the whole query agree (every parameter the client
sent, no more, no less), so a recording pins the exact request. `body` is sent as JSON, or
as is when it is a string (to play a broken server). A request matching no recording gets
the 404 `Status` a real API server sends and is kept in `.unmatched` for the test to fail on.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.paths import DATA

RECORDINGS = DATA / "k8s_recordings"
TOKEN = "recorded-test-token"


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names


@dataclass
class RecordedServer:
    url: str
    recordings: list[dict[str, Any]]
    requests: list[Received] = field(default_factory=list)
    unmatched: list[Received] = field(default_factory=list)
    connections: set[socket.socket] = field(default_factory=set)
    _httpd: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def stop(self) -> None:
        """Stop listening and drop every open connection; later requests are refused."""
        if self._httpd is None or self._thread is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        # Kept-alive connections would outlive the listener: a stopped server must refuse.
        for conn in list(self.connections):
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def answer(self, req: Received) -> dict[str, Any] | None:
        for rec in self.recordings:
            want = rec["request"]
            if (want["method"], want["path"], want.get("query", {})) == (
                req.method,
                req.path,
                req.query,
            ):
                response: dict[str, Any] = rec["response"]
                return response
        return None


def load_recording(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDINGS / f"{name}.json").read_text())
    return data


def not_found_status(path: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"the server could not find the requested resource ({path})",
        "reason": "NotFound",
        "details": {},
        "code": 404,
    }


def _handler(server: RecordedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real API server does

        def setup(self) -> None:
            super().setup()
            server.connections.add(self.connection)

        def finish(self) -> None:
            server.connections.discard(self.connection)
            super().finish()

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            # The client sends each parameter once; a repeated one keeps its last value.
            query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            headers = {k.lower(): v for k, v in self.headers.items()}
            req = Received(self.command, parts.path, query, headers)
            server.requests.append(req)
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            response = server.answer(req)
            if response is None:
                server.unmatched.append(req)
                response = {"status": 404, "body": not_found_status(parts.path)}
            # sleep is the behaviour under test: a recorded response that comes late (timeouts)
            time.sleep(response.get("delay_seconds", 0))
            body = response["body"]
            raw = (body if isinstance(body, str) else json.dumps(body)).encode()
            try:
                self.send_response(response["status"])
                sent = {"Content-Type": "application/json", **response.get("headers", {})}
                for name, value in sent.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up waiting (a timeout test)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test asserts on .requests instead

    return Handler


@contextmanager
def recorded_k8s_server(*names: str) -> Iterator[RecordedServer]:
    """Serves the named recordings (file stems) on 127.0.0.1 and a free port; `.url`,
    `.requests` and `.unmatched` for the test, `.stop()` to play a server going away."""
    state = RecordedServer(url="", recordings=[load_recording(n) for n in names])
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True  # a delayed answer must not hold up the shutdown
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    # A short poll interval: shutdown() waits up to one interval.
    thread = threading.Thread(
        target=httpd.serve_forever, args=(0.02,), name="k8s-recorded", daemon=True
    )
    thread.start()
    state._httpd, state._thread = httpd, thread
    try:
        yield state
    finally:
        state.stop()


def write_kubeconfig(path: Path, server_url: str, token: str = TOKEN) -> Path:
    """A minimal kubeconfig (JSON is YAML) for `server_url` with a bearer token."""
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "recorded", "cluster": {"server": server_url}}],
        "users": [{"name": "sco-demand", "user": {"token": token}}],
        "contexts": [
            {
                "name": "recorded",
                "context": {"cluster": "recorded", "user": "sco-demand", "namespace": "default"},
            }
        ],
        "current-context": "recorded",
    }
    path.write_text(json.dumps(kubeconfig, indent=2))
    return path
