"""A tiny HTTP health endpoint for a long-running process: `/healthz` (the process serves)
and `/readyz` (it does its job: the Temporal worker is polling, the notice relay reaches
its dependencies). Kubernetes probes call these."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


async def serve_health(host: str, port: int, ready: Callable[[], bool]) -> asyncio.AbstractServer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), timeout=5)
            path = request.split(b" ")[1] if request.count(b" ") >= 2 else b"/"
            if path == b"/healthz":
                code, body = 200, b"ok\n"
            elif path == b"/readyz":
                ok = ready()
                code, body = (200, b"ready\n") if ok else (503, b"not ready\n")
            else:
                code, body = 404, b"not found\n"
            reason = {200: "OK", 503: "Service Unavailable", 404: "Not Found"}[code]
            writer.write(
                f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\n"
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
