"""The bundle cache: the last good bundle, on disk, and how new ones get in.

A new bundle replaces the cached one only when it verifies against the trust directory
and its serial is not lower than any accepted before (a rollback); an equal serial must be
the same bytes. A serial advances by at most `max_serial_step` over the highest one held
or recorded, so a bundle signed with a leaked key cannot push the serial out of reach of
every genuine bundle after it. The rollback record keeps the highest serial per signing key:
revoking a key (its id in the trust directory's revoked.txt; the agent re-reads it every
refresh, no restart) drops what that key pushed, and an operator-signed serial reset
(contracts/serial_reset.py) lowers the floor explicitly. The cached file is replaced
atomically, so a crash leaves the old or the new bundle. Every read verifies the file
again, so a file altered on disk is refused; the cache then keeps serving the last bundle
that verified in this process, which is what a node drains by. A bundle older than
`max_age` is stale: reported, and still used. Nothing
here needs the control plane; the distributor is optional.

How the content is read is the cache's user's: a node's cache reads the terms it acts on
(contracts/node_bundle.py, the default: no pydantic, decision 0041); the control plane's
passes `parse=contracts.bundle.parse_content` (every contract rule) and gets BundleContent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Generic, overload

from contracts import serial_reset
from contracts.atomic import write_atomic
from contracts.keys import KeyFileError, TrustStore
from contracts.node_bundle import NodeBundle, parse_node_content
from contracts.signed_bundle import (
    BundleRejected,
    C,
    ContentParser,
    VerifiedBundle,
    verify_as,
)

log = logging.getLogger(__name__)

BUNDLE_FILE = "bundle.json"
#: The highest serial ever accepted: rollback protection that survives a damaged bundle file.
SERIAL_FILE = "serial"
#: The issued_at of the last serial reset applied (an older one is never applied again).
RESET_FILE = "serial-reset"
REFRESH_SECONDS = 60.0
#: How far one bundle may advance the serial over the highest held or recorded.
MAX_SERIAL_STEP = 1000


@dataclass(frozen=True)
class OfferResult(Generic[C]):
    accepted: bool
    changed: bool
    reason: str
    bundle: VerifiedBundle[C] | None  # what the cache holds now


def _now() -> datetime:
    return datetime.now(UTC)


class BundleCache(Generic[C]):
    @overload
    def __init__(
        self: BundleCache[NodeBundle],
        cache_dir: Path,
        trust: TrustStore,
        *,
        max_age: timedelta = ...,
        clock: Callable[[], datetime] = ...,
        max_serial_step: int = ...,
    ) -> None: ...

    @overload
    def __init__(
        self,
        cache_dir: Path,
        trust: TrustStore,
        *,
        parse: ContentParser[C],
        max_age: timedelta = ...,
        clock: Callable[[], datetime] = ...,
        max_serial_step: int = ...,
    ) -> None: ...

    def __init__(
        self,
        cache_dir: Path,
        trust: TrustStore,
        *,
        parse: ContentParser[Any] = parse_node_content,
        max_age: timedelta = timedelta(hours=24),
        clock: Callable[[], datetime] = _now,
        max_serial_step: int = MAX_SERIAL_STEP,
    ) -> None:
        self._parse = parse
        self.path = cache_dir / BUNDLE_FILE
        self._serial_path = cache_dir / SERIAL_FILE
        self._reset_path = cache_dir / RESET_FILE
        self._trust = trust
        self._max_age = max_age
        self._clock = clock
        self._max_step = max_serial_step
        self._last_good: VerifiedBundle[C] | None = None

    @property
    def trust(self) -> TrustStore:
        return self._trust

    def set_trust(self, trust: TrustStore) -> None:
        """Use `trust` from now on (the trust directory read again): a bundle signed by a
        key it revokes or no longer lists stops being held at once."""
        if trust == self._trust:
            return
        self._trust = trust
        held = self._last_good
        if held is not None and (held.key_id in trust.revoked or held.key_id not in trust.keys):
            log.critical(
                "bundle serial %s was signed by key %s, which the trust directory now "
                "revokes: no longer used",
                held.serial,
                held.key_id,
            )
            self._last_good = None

    def current(self) -> VerifiedBundle[C] | None:
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

    def offer(self, raw: bytes) -> OfferResult[C]:
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
        floor = max(seen, held.serial if held is not None else 0)
        if floor and new.serial - floor > self._max_step:
            return OfferResult(
                False,
                False,
                f"refused: serial {new.serial} jumps more than {self._max_step} past "
                f"serial {floor} (a poisoned serial?)",
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
        marks = self._serial_marks()
        marks[new.key_id] = max(marks.get(new.key_id, 0), new.serial)
        self._write_marks(marks)
        self._last_good = new
        return OfferResult(True, True, f"accepted serial {new.serial}", new)

    def apply_reset(self, raw: bytes, region: str) -> OfferResult[C]:
        """Apply an operator-signed serial reset (contracts/serial_reset.py): the rollback
        floor becomes its `to_serial`; a held bundle above it is dropped, so the next
        genuine bundle is accepted. A reset not newer than the last applied is a no-op."""
        held = self._on_disk() or self._last_good
        try:
            reset = serial_reset.verify(raw, self._trust, region=region, now=self._clock())
        except BundleRejected as exc:
            return OfferResult(False, False, f"refused: {exc}", held)
        last = self._last_reset()
        if last is not None and reset.issued_at <= last:
            return OfferResult(
                True, False, f"serial reset of {reset.issued_at} already applied", held
            )
        if held is not None and held.content.created_at > reset.issued_at:
            # The bundle held was signed after the reset was issued: not what it resets.
            write_atomic(self._reset_path, f"{reset.issued_at.isoformat()}\n".encode())
            return OfferResult(
                True,
                False,
                f"serial reset of {reset.issued_at} predates the bundle held (serial "
                f"{held.serial}): nothing to reset",
                held,
            )
        if held is not None and held.serial > reset.to_serial:
            log.critical(
                "serial reset to %s by %s (%s): dropping the held bundle serial %s",
                reset.to_serial,
                reset.by or "an operator",
                reset.reason or "no reason given",
                held.serial,
            )
            self.path.unlink(missing_ok=True)
            self._last_good = None
            held = None
        self._write_marks({"": reset.to_serial})
        write_atomic(self._reset_path, f"{reset.issued_at.isoformat()}\n".encode())
        return OfferResult(
            True, True, f"serial reset applied: rollback floor now {reset.to_serial}", held
        )

    async def refresh_forever(
        self,
        fetch: Callable[[], Awaitable[bytes | None]],
        stop: asyncio.Event,
        interval: float = REFRESH_SECONDS,
        *,
        empty_interval: float | None = None,
        on_change: Callable[[VerifiedBundle[C]], None] | None = None,
        held: Callable[[int | None], Awaitable[object]] | None = None,
        reload_trust: Callable[[], TrustStore] | None = None,
        fetch_reset: Callable[[], Awaitable[bytes | None]] | None = None,
        region: str = "",
    ) -> None:
        """Offer what the distributor has every `interval` until `stop`; never raises.

        While the cache holds no bundle (a fresh node) it asks every `empty_interval`
        instead, when given. `on_change` hears every newly accepted bundle. The
        distributor is optional: its absence or failure keeps the cached bundle.
        `held` is told the serial held after each round (None: no valid bundle), e.g. a
        HoldingReporter's report (contracts/holders.py); its failures are its own.
        `reload_trust` reads the trust directory again each round (a revoked key takes
        effect without a restart); `fetch_reset` brings the region's serial reset, if any.
        """
        while not stop.is_set():
            if reload_trust is not None:
                try:
                    self.set_trust(reload_trust())
                except KeyFileError as exc:
                    log.error("trust directory unreadable, keeping the keys held: %s", exc)
            if fetch_reset is not None:
                try:
                    reset_raw = await fetch_reset()
                except Exception as exc:  # any distributor failure: no reset this round
                    log.warning("serial reset fetch failed: %s", exc)
                    reset_raw = None
                if reset_raw is not None:
                    outcome = self.apply_reset(reset_raw, region)
                    if outcome.changed or not outcome.accepted:
                        level = logging.WARNING if outcome.accepted else logging.ERROR
                        log.log(level, "serial reset: %s", outcome.reason)
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

    def _verify(self, raw: bytes) -> VerifiedBundle[C]:
        return verify_as(raw, self._trust, self._parse, now=self._clock(), max_age=self._max_age)

    def _on_disk(self) -> VerifiedBundle[C] | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        held = self._last_good
        if held is not None and raw == held.raw:
            # The very bytes verified before, under the same trust (set_trust drops a
            # bundle whose key it revokes): only staleness moves. A notice flood must not
            # cost a signature check and a parse of the whole bundle per message.
            stale = self._clock() - held.content.created_at > self._max_age
            return held if stale == held.stale else replace(held, stale=stale)
        try:
            return self._verify(raw)
        except BundleRejected as exc:
            log.error("cached bundle %s is not trusted: %s", self.path, exc)
            return None

    def _highest_serial(self) -> int:
        """The rollback floor: the highest serial recorded for a key not revoked since."""
        return max(
            (s for kid, s in self._serial_marks().items() if kid not in self._trust.revoked),
            default=0,
        )

    def _serial_marks(self) -> dict[str, int]:
        """key id -> highest serial accepted from it; "" for a record without a key (one
        written before keys were recorded, or by a serial reset)."""
        try:
            text = self._serial_path.read_text()[:65536]
        except (FileNotFoundError, ValueError, OSError):
            return {}
        marks: dict[str, int] = {}
        for line in text.splitlines():
            parts = line.split()
            if not parts or len(parts) > 2 or not parts[0].isdigit() or len(parts[0]) > 20:
                continue
            kid = parts[1] if len(parts) == 2 else ""
            marks[kid] = max(marks.get(kid, 0), int(parts[0]))
        return marks

    def _write_marks(self, marks: dict[str, int]) -> None:
        lines = [f"{serial} {kid}".rstrip() for kid, serial in sorted(marks.items())]
        write_atomic(self._serial_path, ("\n".join(lines) + "\n").encode())

    def _last_reset(self) -> datetime | None:
        try:
            return datetime.fromisoformat(self._reset_path.read_text().strip()[:64])
        except (FileNotFoundError, ValueError, OSError):
            return None
