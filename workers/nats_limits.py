"""JetStream limits on the streams a node's agent can touch.

The agents' NATS users (workers/nats_permissions.py) may create ephemeral consumers on the
region's bundle object store, never named durable ones and never delete one. What bounds
a compromised node there is the stream itself: at most `BUNDLE_MAX_CONSUMERS` consumers,
each dropped by the server `BUNDLE_CONSUMER_IDLE_SECONDS` after its reader went away (a
request for a longer idle time is refused). A download takes seconds and an agent fetches
once a minute, so a region of thousands of nodes stays far below the cap.

The notice stream needs no such cap: an agent may create one consumer there, its own
durable, filtered on its own subject (the create subject carries both). The drain stream
is written with plain publishes only; its limits are the drain intake's
(services/drain_intake/intake.py).
"""

from __future__ import annotations

import logging

import nats
from nats.js import JetStreamContext
from nats.js.api import StreamConsumerLimits
from nats.js.errors import NotFoundError

from contracts.distribution import bucket_for
from workers.client_security import nats_options
from workers.settings import Settings

log = logging.getLogger(__name__)

BUNDLE_MAX_CONSUMERS = 4096
BUNDLE_CONSUMER_IDLE_SECONDS = 30.0


def bundle_stream(region: str) -> str:
    return f"OBJ_{bucket_for(region)}"


async def limit_bundle_stream(js: JetStreamContext, region: str) -> bool:
    """Give the region's bundle stream its consumer limits; True when it changed them."""
    info = await js.stream_info(bundle_stream(region))
    config = info.config
    limits = config.consumer_limits
    if (
        config.max_consumers == BUNDLE_MAX_CONSUMERS
        and limits is not None
        and limits.inactive_threshold == BUNDLE_CONSUMER_IDLE_SECONDS
    ):
        return False
    config.max_consumers = BUNDLE_MAX_CONSUMERS
    config.consumer_limits = StreamConsumerLimits(inactive_threshold=BUNDLE_CONSUMER_IDLE_SECONDS)
    await js.update_stream(config)
    return True


async def limit_agent_streams(settings: Settings, region: str) -> bool:
    """`limit_bundle_stream` on the control plane's own connection, after a publish
    (`sco contracts publish`, the contract sync); False when there is no stream yet."""
    nc = await nats.connect(
        settings.nats_url, connect_timeout=5, max_reconnect_attempts=1, **nats_options(settings)
    )
    try:
        return await limit_bundle_stream(nc.jetstream(), region)
    except NotFoundError:
        return False
    finally:
        await nc.close()
