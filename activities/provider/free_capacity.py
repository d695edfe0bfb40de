"""Free capacity of many pools at once, as planners read it: a bounded number of calls in
flight, and a pool the provider cannot answer for counted as full (0), so nothing is ever
planned into capacity nobody vouched for and one bad pool does not fail a whole round."""

from __future__ import annotations

import asyncio
import logging

from activities.provider.errors import ProviderError
from activities.provider.interface import CloudProvider

log = logging.getLogger(__name__)

#: Calls in flight at once (a region has hundreds of pools; the provider has a rate limit).
CONCURRENCY = 16


async def free_capacity(provider: CloudProvider, pool_ids: list[str]) -> dict[str, int]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(pool_id: str) -> tuple[str, int]:
        async with gate:
            try:
                return pool_id, await provider.free_capacity(pool_id)
            except ProviderError as exc:
                log.warning("free capacity of %s: %s", pool_id, exc)
                return pool_id, 0

    return dict(await asyncio.gather(*(one(p) for p in pool_ids)))
