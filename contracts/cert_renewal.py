"""A process's own certificate, renewed before it expires, without a restart.

One narrow interface, `CertificateSource.fetch()`: a fresh certificate (with the chain the
peer needs) and its key. OpenBao's PKI role for the process's kind is one source
(workers/openbao/source.py); a SPIRE Workload API client (`FetchX509SVID`) is another
with the same shape, so it replaces OpenBao without anything here changing.

`Renewer` keeps the files the process's clients read current: at `renew_fraction` of the
certificate's lifetime (2/3 by default) it fetches a new one, writes certificate and key
atomically (0600, a reader sees the old pair or the new one), then reloads:
- every registered `ssl.SSLContext` (`load_cert_chain` again on the same object: the next
  handshake made with it presents the new certificate; nats-py keeps the context it was
  given and makes every reconnect's handshake with it);
- every registered hook (a Temporal client is made anew: its TLS is fixed at connect).
Connections already open keep working: a certificate is checked at the handshake only.

A failed fetch is retried (within a tenth of the time left, at least every `min_retry_s`,
at most every `max_retry_s`) and counted; the certificate in hand stays in use until it
expires, and its notAfter gauge is what the expiry alert reads.

No control-plane imports: the node agent uses it too (tests/test_layering.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import logging
import ssl
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from contracts.atomic import write_atomic

log = logging.getLogger(__name__)

#: Renew at this fraction of the lifetime: a third of it is left to retry a failed fetch.
DEFAULT_RENEW_FRACTION = 2 / 3


@dataclass(frozen=True)
class CertBundle:
    """What a source gives: PEM certificate (leaf first, then the intermediates a peer
    needs to reach the trust root), PEM key, and the leaf's validity."""

    cert_pem: bytes
    key_pem: bytes
    not_before: dt.datetime
    not_after: dt.datetime
    identity: str = ""  # the SPIFFE ID it carries

    @property
    def lifetime(self) -> dt.timedelta:
        return self.not_after - self.not_before


class CertificateSource(Protocol):
    """Where a process's certificate comes from.

    `fetch` blocks (it is called in a thread) and returns a new certificate and key, or
    raises: any exception is a failed renewal, retried by the `Renewer`; nothing here
    distinguishes kinds of failure. `name` labels the metrics and `sco dev status`."""

    @property
    def name(self) -> str: ...

    def fetch(self) -> CertBundle: ...


def read_validity(cert_path: Path) -> tuple[dt.datetime, dt.datetime] | None:
    """(notBefore, notAfter) of the first certificate in the file; None if unreadable
    (or where `cryptography` is not installed: the node agent's package has no need of it)."""
    try:
        from cryptography import x509
    except ImportError:
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError):
        return None
    return cert.not_valid_before_utc, cert.not_valid_after_utc


def bundle_validity(cert_pem: bytes) -> tuple[dt.datetime, dt.datetime]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.not_valid_before_utc, cert.not_valid_after_utc


def write_pair(bundle: CertBundle, cert_path: Path, key_path: Path) -> None:
    """Key first, then certificate, each replaced atomically and 0600: a reader that sees
    the new certificate finds its key already there (a pair read between the two renames
    is the old certificate with the new key; `load_cert_chain` refuses that, and the
    caller retries it after the second rename)."""
    write_atomic(key_path, bundle.key_pem, mode=0o600)
    write_atomic(cert_path, bundle.cert_pem, mode=0o600)


Hook = Callable[[CertBundle], Awaitable[None] | None]


class Renewer:
    """Keeps `cert_path`/`key_path` current from `source` while `run` runs."""

    def __init__(
        self,
        source: CertificateSource,
        cert_path: Path,
        key_path: Path,
        *,
        renew_fraction: float = DEFAULT_RENEW_FRACTION,
        min_retry_s: float = 2.0,
        max_retry_s: float = 60.0,
        on_renewed: Callable[[CertBundle], None] | None = None,
        on_failed: Callable[[BaseException], None] | None = None,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        if not 0.1 <= renew_fraction <= 0.95:
            raise ValueError(f"renew_fraction {renew_fraction}: must be 0.1 to 0.95")
        self.source = source
        self.cert_path = cert_path
        self.key_path = key_path
        self.fraction = renew_fraction
        self._min_retry = min_retry_s
        self._max_retry = max_retry_s
        self._on_renewed = on_renewed
        self._on_failed = on_failed
        self._now = now
        self._contexts: weakref.WeakSet[ssl.SSLContext] = weakref.WeakSet()
        self._hooks: list[Hook] = []
        self.renewals = 0
        self.failures = 0
        self.not_after: dt.datetime | None = None
        self.not_before: dt.datetime | None = None

    # -- what reloads ----------------------------------------------------------------------

    def add_context(self, ctx: ssl.SSLContext) -> None:
        """Reload `ctx` after every renewal (kept weakly: a closed client's goes away)."""
        self._contexts.add(ctx)

    def add_hook(self, hook: Hook) -> None:
        """Call `hook(bundle)` after every renewal, after the files are written and the
        contexts reloaded (a coroutine function is awaited; an exception is logged)."""
        self._hooks.append(hook)

    # -- the schedule ----------------------------------------------------------------------

    def renew_at(self) -> dt.datetime | None:
        if self.not_after is None or self.not_before is None:
            return None
        return self.not_before + (self.not_after - self.not_before) * self.fraction

    def due(self) -> bool:
        at = self.renew_at()
        return at is None or self._now() >= at

    async def ensure_current(self) -> None:
        """Before the process makes its clients: the files on disk, if not yet due for
        renewal; otherwise a new certificate now (raises if the source fails)."""
        validity = read_validity(self.cert_path)
        if validity is not None and self.key_path.is_file():
            self.not_before, self.not_after = validity
        if self.due():
            await self.renew()

    async def renew(self) -> CertBundle:
        """Fetch, write, reload; raises what the source raised (counted as a failure)."""
        try:
            bundle = await asyncio.to_thread(self.source.fetch)
            await asyncio.to_thread(write_pair, bundle, self.cert_path, self.key_path)
        except Exception as exc:
            self.failures += 1
            if self._on_failed is not None:
                self._on_failed(exc)
            raise
        self.not_before, self.not_after = bundle.not_before, bundle.not_after
        self.renewals += 1
        for ctx in list(self._contexts):
            ctx.load_cert_chain(str(self.cert_path), str(self.key_path))
        if self._on_renewed is not None:
            self._on_renewed(bundle)
        log.info(
            "certificate %s renewed from %s, valid until %s",
            bundle.identity or self.cert_path.name,
            self.source.name,
            bundle.not_after.isoformat(timespec="seconds"),
        )
        for hook in list(self._hooks):
            try:
                result = hook(bundle)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("reloading after the certificate renewal failed")
        return bundle

    def _retry_in(self) -> float:
        left = (self.not_after - self._now()).total_seconds() if self.not_after else 0.0
        return max(self._min_retry, min(self._max_retry, left / 10))

    async def run(self, stop: asyncio.Event) -> None:
        """Renew at the renewal point until `stop` is set; failures retried, never raised."""
        while not stop.is_set():
            at = self.renew_at()
            wait = 0.0 if at is None else max(0.0, (at - self._now()).total_seconds())
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
                continue
            try:
                await self.renew()
            except Exception as exc:
                retry = self._retry_in()
                log.warning(
                    "certificate renewal from %s failed (%s); retrying in %.0f s",
                    self.source.name,
                    exc,
                    retry,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), retry)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """`ensure_current`, then `run` in a task for the block's duration."""
        await self.ensure_current()
        stop = asyncio.Event()
        task = asyncio.create_task(self.run(stop), name="certificate-renewer")
        try:
            yield
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def follow_files(
    ctx: ssl.SSLContext,
    cert_path: Path,
    key_path: Path,
    stop: asyncio.Event,
    *,
    every_s: float = 10.0,
) -> None:
    """For a process whose certificate files someone else renews (an OpenBao Agent, a
    cert-manager mount, a node's timer): reload `ctx` whenever the certificate file
    changes, so the next handshake presents the renewed one. A pair caught between the
    two renames (new certificate, old key) is refused by OpenSSL and tried again next time."""

    def stamp() -> tuple[int, int] | None:
        try:
            st = cert_path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_ino

    seen = stamp()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
        now = stamp()
        if now is None or now == seen:
            continue
        try:
            ctx.load_cert_chain(str(cert_path), str(key_path))
        except (OSError, ssl.SSLError) as exc:
            log.warning("%s changed but does not load yet (%s); trying again", cert_path, exc)
            continue
        seen = now
        validity = read_validity(cert_path)
        log.info(
            "reloaded %s (valid until %s)",
            cert_path,
            validity[1].isoformat(timespec="seconds") if validity else "?",
        )
