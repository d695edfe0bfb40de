"""A long-running process's certificate renewal from its settings (`identity`): the
source, the metrics, and what a renewal reloads in the shared clients.

Every service's `run` is started through `services.registry.Service.load`, which calls
`start(settings)` first; with `identity.source = "openbao"` the process issues its own
certificate before making any client, and renews it while it runs:
- NATS: every context `client_security.ssl_context` made with the file loads it again;
  the connection in hand stays up (checked at its handshake only), and the next
  (re)connect presents the new certificate;
- PostgreSQL: libpq reads `sslcert`/`sslkey` at each new connection; pools are opened with
  `pool_max_lifetime(settings)`, so every connection is replaced within one renewal period;
- Temporal: the SDK fixes TLS at connect, so the worker registers a hook that connects a
  new client and hands it to the Worker (`worker.client = new`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

from contracts.cert_renewal import CertBundle, Renewer
from workers.client_security import observe_client_cert, reload_client_certificates
from workers.settings import Settings

if TYPE_CHECKING:
    from prometheus_client import Counter

log = logging.getLogger(__name__)

_counters: dict[str, Counter] = {}


def _counter(name: str, doc: str) -> Counter:
    if name not in _counters:
        from prometheus_client import Counter

        _counters[name] = Counter(name, doc, ["source"])
    return _counters[name]


def renewals_total() -> Counter:
    return _counter(
        "sco_certificate_renewals",
        "Certificates this process fetched and loaded without a restart, by source",
    )


def renewal_failures_total() -> Counter:
    return _counter(
        "sco_certificate_renewal_failures",
        "Certificate renewals that failed (retried; the certificate in hand stays in use)",
    )


def renewer(settings: Settings) -> Renewer | None:
    """The process's renewer, or None when its certificate files are someone else's."""
    ident = settings.identity
    if ident.source != "openbao":
        return None
    assert ident.cert_file is not None and ident.key_file is not None  # the validator
    from workers.openbao.source import OpenBaoSource

    if settings.openbao.token_file is None:
        raise ValueError("identity.source openbao needs openbao.token_file (this process's token)")
    source = OpenBaoSource.from_files(
        settings.openbao.address,
        token_file=settings.openbao.token_file,
        ca_file=settings.openbao.ca_file,
        region=settings.region,
        kind=ident.kind,
        ttl_s=ident.ttl_seconds,
        key_file=ident.key_file,
    )
    cert, key = ident.cert_file, ident.key_file
    # Both exist from the start, so a scrape shows 0 rather than nothing.
    renewals_total().labels(source.name)
    renewal_failures_total().labels(source.name)

    def renewed(_bundle: CertBundle) -> None:
        renewals_total().labels(source.name).inc()
        reload_client_certificates(cert, key)
        observe_client_cert(cert, "identity.cert_file")

    def failed(_exc: BaseException) -> None:
        renewal_failures_total().labels(source.name).inc()

    return Renewer(
        source,
        cert,
        key,
        renew_fraction=ident.renew_fraction,
        on_renewed=renewed,
        on_failed=failed,
    )


_running: list[Renewer] = []


def current() -> Renewer | None:
    """The renewer `start` runs in this process, if any (the worker adds its hook to it)."""
    return _running[0] if _running else None


def start(settings: Settings) -> Renewer | None:
    """Make the certificate current (a fetch now when missing or due; raises when that
    fails: a process cannot start without its identity), then renew it in a thread of its
    own with its own event loop, whatever the process's own loop does (some are
    synchronous). Once per process; None when the certificate is not ours to renew."""
    if _running:
        return _running[0]
    r = renewer(settings)
    if r is None:
        return None
    asyncio.run(r.ensure_current())
    observe_client_cert(r.cert_path, "identity.cert_file")
    _running.append(r)
    threading.Thread(
        target=lambda: asyncio.run(r.run(asyncio.Event())),
        name="certificate-renewer",
        daemon=True,  # ends with the process: nothing to flush, the files are whole
    ).start()
    return r


def pool_max_lifetime(settings: Settings) -> float | None:
    """How long a PostgreSQL connection may live: one renewal period when the process
    renews its certificate (each new connection presents the current one), else the pool's
    default."""
    ident = settings.identity
    if ident.source != "openbao":
        return None
    return max(30.0, ident.ttl_seconds * ident.renew_fraction)
