"""The contract bundle the agent drains by: the verified cache, with the last good kept.

The cache re-verifies the file on every read, so a bundle altered on disk is refused; the
agent then keeps using the last bundle that verified in this process. With none at all it
still drains, by the conservative default (requeue), and says so loudly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from contracts.bundle import BundleRejected, VerifiedBundle, verify
from contracts.cache import BundleCache, OfferResult
from contracts.keys import TrustStore

log = logging.getLogger(__name__)


class BundleHolder:
    def __init__(
        self, cache: BundleCache | None, trust: TrustStore | None = None, why_no_cache: str = ""
    ) -> None:
        self._cache = cache
        self._trust = trust
        self._why_no_cache = why_no_cache
        self._last_good: VerifiedBundle | None = None

    def current(self) -> VerifiedBundle | None:
        """The cached bundle if it still verifies, else the last good one, else None."""
        fresh = self._cache.current() if self._cache is not None else None
        if fresh is not None:
            if self._last_good is None or fresh.raw != self._last_good.raw:
                log.info("contract bundle serial %s in use", fresh.serial)
            self._last_good = fresh
            return fresh
        if self._last_good is not None:
            log.error(
                "cached bundle no longer verifies; draining by the last good serial %s",
                self._last_good.serial,
            )
            return self._last_good
        log.critical(
            "NO VALID CONTRACT BUNDLE%s: drains use the conservative default (requeue)",
            f" ({self._why_no_cache})" if self._why_no_cache else "",
        )
        return None

    def offer(self, raw: bytes) -> OfferResult:
        """Offer a new bundle to the cache, also refusing a rollback below the last good
        serial (the cache alone cannot tell once its own file was damaged)."""
        held = self._last_good
        if self._cache is None:
            return OfferResult(False, False, f"refused: {self._why_no_cache}", None)
        if held is not None and self._trust is not None:
            try:
                new = verify(raw, self._trust)
            except BundleRejected as exc:
                return OfferResult(False, False, f"refused: {exc}", held)
            if new.serial < held.serial:
                return OfferResult(
                    False,
                    False,
                    f"refused: serial {new.serial} is older than the last good "
                    f"{held.serial} (rollback)",
                    held,
                )
        result = self._cache.offer(raw)
        if result.accepted and result.bundle is not None:
            self._last_good = result.bundle
        return result

    async def refresh_forever(
        self,
        fetch: Callable[[], Awaitable[bytes | None]],
        stop: asyncio.Event,
        interval: float,
    ) -> None:
        """Offer the distributor's bundle to the cache every `interval`; never raises."""
        if self._cache is None:
            return
        while not stop.is_set():
            try:
                raw = await fetch()
                if raw is not None:
                    result = self.offer(raw)
                    if result.changed or not result.accepted:
                        level = logging.INFO if result.accepted else logging.ERROR
                        log.log(level, "bundle refresh: %s", result.reason)
            except Exception as exc:  # the distributor is optional: keep what we have
                log.warning("bundle refresh failed, keeping the cached bundle: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)
