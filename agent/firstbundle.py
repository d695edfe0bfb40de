"""A fresh node's first contract bundle: fetched from the distributor (NATS object store)
before the agent serves, by `sco-agent --check` (the unit's ExecStartPre) and by the agent
itself at start; afterwards the refresh loop keeps it current.

Until a node holds a bundle it drains by the conservative default (requeue every
workload): that is always safer than not running, so "no bundle yet" never stops the
agent from starting, it only makes it say so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agent.config import AgentConfig
from agent.natslink import nats_options
from contracts.cache import BundleCache
from contracts.distribution import NatsBundleSource
from contracts.node_bundle import NodeBundle

#: How long a start waits for the first bundle (connect 5 s + download 10 s per server).
FIRST_FETCH_SECONDS = 20.0


def fetcher(config: AgentConfig, *, reset: bool = False) -> Callable[[], Awaitable[bytes | None]]:
    """Fetch the region's bundle (`reset`: its serial reset) from the first NATS server
    that answers; None when none was published; raises when no server answered."""
    options = nats_options(config)
    sources = [NatsBundleSource(url, config.region, options) for url in config.nats_urls]

    async def fetch() -> bytes | None:
        last: Exception | None = None
        for source in sources:
            try:
                return await (source.fetch_reset() if reset else source.fetch())
            except Exception as exc:  # try the next server
                last = exc
        raise RuntimeError(f"no NATS server answered: {last}")

    return fetch


@dataclass(frozen=True)
class FirstFetch:
    serial: int | None  # the serial now held, None when still none
    detail: str  # what happened, for the log and --check


async def fetch_first(
    cache: BundleCache[NodeBundle], config: AgentConfig, seconds: float = FIRST_FETCH_SECONDS
) -> FirstFetch:
    """Offer the distributor's bundle to `cache`, bounded by `seconds`; never raises."""
    if not config.nats_urls:
        return FirstFetch(None, "no nats_urls configured: nothing to fetch a bundle from")
    try:
        raw = await asyncio.wait_for(fetcher(config)(), seconds)
    except TimeoutError:
        return FirstFetch(None, f"the distributor did not answer within {seconds:.0f} s")
    except Exception as exc:
        return FirstFetch(None, f"distributor unreachable ({exc})")
    if raw is None:
        return FirstFetch(None, f"none published yet for region {config.region}")
    try:
        reset = await asyncio.wait_for(fetcher(config, reset=True)(), seconds)
    except Exception:  # a reset is optional; the refresh loop asks again
        reset = None
    if reset is not None:
        cache.apply_reset(reset, config.region)
    result = cache.offer(raw)
    if not result.accepted or result.bundle is None:
        return FirstFetch(None, f"the distributor's bundle was {result.reason}")
    return FirstFetch(
        result.bundle.serial,
        f"first bundle fetched from the distributor: {result.reason}",
    )


def fetch_first_sync(cache: BundleCache[NodeBundle], config: AgentConfig) -> FirstFetch:
    return asyncio.run(fetch_first(cache, config))
