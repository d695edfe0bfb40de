"""The agent's end: one request over a workload's socket, bounded by a timeout."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from agent.checkpoint.protocol import MAX_LINE, ProtocolError, Reply, Request, decode_reply


async def send_request(path: Path, request: Request, limit_seconds: float) -> Reply:
    """The workload's reply; raises TimeoutError, OSError (no one listening) or
    ProtocolError."""
    async with asyncio.timeout(max(limit_seconds, 0.0)):
        reader, writer = await asyncio.open_unix_connection(str(path), limit=MAX_LINE)
        try:
            writer.write(request.encode())
            await writer.drain()
            line = await reader.readline()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    if not line:
        raise ProtocolError("the workload closed the socket without answering")
    return decode_reply(line)
