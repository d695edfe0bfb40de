"""The bundle cache: the last good bundle, on disk, and how new ones get in.

A new bundle replaces the cached one only when it verifies against the trust directory
and its serial is not lower than any accepted before (a rollback); an equal serial must be
the same bytes. The cached file is replaced atomically, so a crash leaves the old or the
new bundle. Every read verifies the file again, so a file altered on disk is refused; the
cache then keeps serving the last bundle that verified in this process, which is what a
node drains by. A bundle older than `max_age` is stale: reported, and still used. Nothing
here needs the control plane; the distributor is optional.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from contracts.atomic import write_atomic
from contracts.bundle import BundleRejected, VerifiedBundle, verify
from contracts.keys import KeyFileError, TrustStore

log = logging.getLogger(__name__)

BUNDLE_FILE = "bundle.json"
#: The highest serial ever accepted: rollback protection that survives a damaged bundle file.
SERIAL_FILE = "serial"
REFRESH_SECONDS = 60.0


@dataclass(frozen=True)
class OfferResult:
    accepted: bool
    changed: bool
    reason: str
    bundle: VerifiedBundle | None  # what the cache holds now


class BundleCache:
    def __init__(
        self,
        cache_dir: Path,
        trust: TrustStore,
        *,
        max_age: timedelta = timedelta(hours=24),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.path = cache_dir / BUNDLE_FILE
        self._serial_path = cache_dir / SERIAL_FILE
        self._trust = trust
        self._max_age = max_age
        self._clock = clock
        self._last_good: VerifiedBundle | None = None

    def current(self) -> VerifiedBundle | None:
        """The cached bundle, verified again; when the file no longer verifies, the last
        good bundle this cache read or accepted; else None."""
        fresh = self._on_disk()
        if fresh is not None:
            if self._last_good is None or fresh.raw != self._last_good.raw:
                log.info("contract bundle serial %s in use", fresh.serial)
            self._last_good = fresh
            return fresh
        if self._last_good is not None:
            log.error(
                "cached bundle no longer verifies; using the last good serial %s",
                self._last_good.serial,
            )
        return self._last_good

    def offer(self, raw: bytes) -> OfferResult:
        on_disk = self._on_disk()
        held = on_disk or self._last_good
        try:
            new = self._verify(raw)
        except BundleRejected as exc:
            return OfferResult(False, False, f"refused: {exc}", held)
        if held is not None and new.serial < held.serial:
            return OfferResult(
                False,
                False,
                f"refused: serial {new.serial} is older than the last good {held.serial} "
                "(rollback)",
                held,
            )
        # Nothing valid is held (first install, or the file was damaged before this
        # process read it): the serial record still refuses a rollback.
        seen = self._highest_serial()
        if new.serial < seen:
            return OfferResult(
                False,
                False,
                f"refused: serial {new.serial} is older than serial {seen} accepted before "
                "(rollback)",
                held,
            )
        if held is not None and new.serial == held.serial:
            if new.raw != held.raw:
                return OfferResult(
                    False,
                    False,
                    f"refused: serial {new.serial} is already cached with different content",
                    held,
                )
            if on_disk is not None:
                return OfferResult(True, False, f"unchanged (serial {new.serial})", held)
            # The same bundle again while the file is damaged: written back below.
        write_atomic(self.path, raw)
        write_atomic(self._serial_path, f"{new.serial}\n".encode())
        self._last_good = new
        return OfferResult(True, True, f"accepted serial {new.serial}", new)

    async def refresh_forever(
        self,
        fetch: Callable[[], Awaitable[bytes | None]],
        stop: asyncio.Event,
        interval: float = REFRESH_SECONDS,
        *,
        empty_interval: float | None = None,
        on_change: Callable[[VerifiedBundle], None] | None = None,
        held: Callable[[int | None], Awaitable[object]] | None = None,
    ) -> None:
        """Offer what the distributor has every `interval` until `stop`; never raises.

        While the cache holds no bundle (a fresh node) it asks every `empty_interval`
        instead, when given. `on_change` hears every newly accepted bundle. The
        distributor is optional: its absence or failure keeps the cached bundle.
        `held` is told the serial held after each round (None: no valid bundle), e.g. a
        HoldingReporter's report (contracts/holders.py); its failures are its own.
        """
        while not stop.is_set():
            try:
                raw = await fetch()
            except Exception as exc:  # any distributor failure: keep the cached bundle
                log.warning("bundle refresh failed, keeping the cached bundle: %s", exc)
                raw = None
            if raw is not None:
                result = self.offer(raw)
                if result.changed or not result.accepted:
                    level = logging.INFO if result.accepted else logging.ERROR
                    log.log(level, "bundle refresh: %s", result.reason)
                if result.changed and result.bundle is not None and on_change is not None:
                    on_change(result.bundle)
            wait = interval
            if empty_interval is not None and self._last_good is None:
                wait = min(interval, empty_interval)
            if held is not None:
                bundle = self.current()
                try:
                    await held(bundle.serial if bundle else None)
                except Exception as exc:  # reporting must never stop the refresh
                    log.warning("reporting the held bundle failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)

    def _verify(self, raw: bytes) -> VerifiedBundle:
        return verify(raw, self._trust, now=self._clock(), max_age=self._max_age)

    def _on_disk(self) -> VerifiedBundle | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return self._verify(raw)
        except BundleRejected as exc:
            log.error("cached bundle %s is not trusted: %s", self.path, exc)
            return None

    def _highest_serial(self) -> int:
        try:
            return int(self._serial_path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0


def installed_bundle(cache_dir: Path, trust_dir: Path) -> tuple[VerifiedBundle | None, str]:
    """The bundle installed in `cache_dir`, verified against `trust_dir`, or None and why.

    What the control plane plans from and the CLI checks against; nodes use the cache
    directly.
    """
    try:
        trust = TrustStore.load(trust_dir)
    except KeyFileError as exc:
        return None, f"contract trust: {exc}"
    bundle = BundleCache(cache_dir, trust).current()
    if bundle is None:
        return None, (
            f"no valid contract bundle in {cache_dir} "
            "(install one with `sco contracts install BUNDLE`)"
        )
    return bundle, ""
