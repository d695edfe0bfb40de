"""Wait until the NATS server has processed everything a client has queued.

nats-py's `flush()` writes its PING straight to the socket, ahead of commands still in the
client's pending buffer: under load its PONG comes back before the server has seen a SUB
queued just before it, and a message published next is missed (seen in the server's trace
log: PING, PONG, then the SUB after the other client's PUB). Pushing the pending buffer out
first, and waiting until it is written, puts the PING behind it.
"""

from __future__ import annotations

from nats.aio.client import Client


async def server_has_seen(nc: Client) -> None:
    """Every command queued on `nc` so far has been processed by the server."""
    await nc._flush_pending(force_flush=True)  # the SUBs, PUBs queued so far, written
    await nc.flush()  # ... and the server's PONG comes after it has read them
