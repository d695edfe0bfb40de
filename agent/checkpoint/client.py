"""The agent's end: one request over a workload's socket, bounded by a deadline.

Every call has its own deadline (connect, send and reply together), so one slow or silent
workload never holds up another: the drain engine tells each workload concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from agent.checkpoint.peer import JobOwner, check_path, check_peer, peer_credentials
from agent.checkpoint.protocol import MAX_LINE, ProtocolError, Reply, Request, decode_reply


async def send_request(
    path: Path, request: Request, limit_seconds: float, owner: JobOwner | None = None
) -> Reply:
    """The workload's reply; raises TimeoutError, OSError (no one listening), ProtocolError
    (no reply, or not one of protocol v1) or PeerRefused (the socket, or the process
    serving it, is not the job's: `owner`, else the owner of the socket's directory)."""
    owner = owner if owner is not None else JobOwner()
    async with asyncio.timeout(max(limit_seconds, 0.0)):
        uid = check_path(path, owner)
        reader, writer = await asyncio.open_unix_connection(str(path), limit=MAX_LINE)
        try:
            check_peer(peer_credentials(writer.get_extra_info("socket")), uid, owner)
            writer.write(request.encode())
            await writer.drain()
            try:
                line = await reader.readline()
            except ValueError as exc:  # longer than MAX_LINE (asyncio's LimitOverrunError)
                raise ProtocolError(f"reply longer than {MAX_LINE} bytes") from exc
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    if not line.endswith(b"\n"):
        raise ProtocolError("the workload closed the socket without a whole reply")
    return decode_reply(line)
