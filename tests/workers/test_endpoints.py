"""workers/endpoints.py: /healthz answers while the process serves, /readyz follows its
readiness (503 while a dependency is away), in the threaded and the asyncio variant."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request

import pytest

from tests.support import services
from workers.endpoints import PortInUse, health_thread, serve_health, start_metrics


def _get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_threaded_health_follows_readiness() -> None:
    ready = False
    port = services.free_port()
    health = health_thread(port, lambda: ready)
    assert health is not None
    try:
        assert _get(port, "/healthz") == 200
        assert _get(port, "/readyz") == 503
        ready = True
        assert _get(port, "/readyz") == 200
        assert _get(port, "/metrics") == 404
    finally:
        health.close()
    assert health_thread(0, lambda: True) is None  # port 0: off


async def test_asyncio_health_follows_readiness() -> None:
    ready = [False]
    port = services.free_port()
    server = await serve_health("127.0.0.1", port, lambda: ready[0])
    try:
        assert await asyncio.to_thread(_get, port, "/healthz") == 200
        assert await asyncio.to_thread(_get, port, "/readyz") == 503
        ready[0] = True
        assert await asyncio.to_thread(_get, port, "/readyz") == 200
    finally:
        server.close()


def test_a_metrics_port_in_use_names_the_setting_that_chose_it() -> None:
    # Two region workers on one default port (9465) died with a bare "[Errno 98]".
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUse, match=rf"SCO_WORKER__STATE_METRICS_PORT={port}: "):
            start_metrics(port, setting="SCO_WORKER__STATE_METRICS_PORT")
