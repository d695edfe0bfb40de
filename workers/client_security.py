"""TLS and credentials for every client SCO makes, from settings.

Secrets are files (a Kubernetes Secret mount) read here, when a client is made, and handed
straight to the client library; settings hold only paths, so printing settings (`repr`,
`sco dev status`, logs) never shows a secret.
"""

from __future__ import annotations

import ssl
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from workers.settings import KafkaSettings, Settings, TLSSettings

if TYPE_CHECKING:
    from prometheus_client import Gauge

_cert_gauge: list[Gauge] = []  # notAfter, notBefore
# The box probes its services from several threads at once: two first loads both made
# the gauge and the second registration raised "Duplicated timeseries".
_cert_gauge_lock = threading.Lock()


def _client_cert_not_after() -> Gauge:
    """The gauge, registered with the first certificate a process loads: a command that
    loads none (most, in the box) does not import prometheus_client for it."""
    with _cert_gauge_lock:
        if _cert_gauge:
            return _cert_gauge[0]
        from prometheus_client import Gauge

        _cert_gauge.append(
            Gauge(
                "sco_client_certificate_not_after_timestamp_seconds",
                "notAfter of the client certificate this process last loaded, by the "
                "setting naming it",
                ["setting"],
            )
        )
        # With notAfter, the lifetime: the expiry alert fires inside the last quarter of
        # it, whether certificates live a day (cert-manager) or ten minutes (OpenBao).
        _cert_gauge.append(
            Gauge(
                "sco_client_certificate_not_before_timestamp_seconds",
                "notBefore of the client certificate this process last loaded, by the "
                "setting naming it",
                ["setting"],
            )
        )
    return _cert_gauge[0]


def _client_cert_not_before() -> Gauge:
    _client_cert_not_after()
    return _cert_gauge[1]


# What a certificate renewal reloads (workers/cert_renewal.py): every client context made
# with a certificate file, and every setting whose gauge shows that file's notAfter.
_contexts: dict[Path, weakref.WeakSet[ssl.SSLContext]] = {}
_observed: dict[str, Path] = {}


def reload_client_certificates(cert: Path, key: Path) -> int:
    """After `cert`/`key` were renewed: every context made with them loads them again (the
    next handshake presents the new certificate; nats-py makes each reconnect with the
    context it was given) and the gauges of the settings naming them show the new notAfter.
    How many contexts were reloaded."""
    contexts = list(_contexts.get(cert.resolve(), ()))
    for ctx in contexts:
        ctx.load_cert_chain(str(cert), str(key))
    for setting, path in list(_observed.items()):
        if path == cert.resolve():
            observe_client_cert(path, setting)
    return len(contexts)


class SecretFileError(ValueError):
    """A configured secret or certificate file cannot be read; names setting and file."""


def read_file(path: Path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SecretFileError(f"{setting}: {path}: {exc.strerror}") from exc


def observe_client_cert(path: Path | None, setting: str) -> None:
    """Export the client certificate's notAfter (SCOClientCertificateExpiring fires inside
    the renewal window): read when a client is made, so a renewed file shows at once. An
    unreadable certificate is left to the client library, which names it."""
    if path is None:
        return
    _observed[setting] = path.resolve()
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return
    _client_cert_not_after().labels(setting).set(cert.not_valid_after_utc.timestamp())
    _client_cert_not_before().labels(setting).set(cert.not_valid_before_utc.timestamp())


def read_secret(path: Path, setting: str) -> str:
    """A password or token file's content, without the trailing newline editors add."""
    return read_file(path, setting).decode().rstrip("\r\n")


def ssl_context(t: TLSSettings, setting: str) -> ssl.SSLContext | None:
    """A verifying client context (hostname checked), or None when TLS is off."""
    if not t.enabled:
        return None
    for name, path in (("ca_file", t.ca_file), ("client_cert_file", t.client_cert_file)):
        if path is not None and not path.is_file():
            raise SecretFileError(f"{setting}.{name}: {path}: no such file")
    observe_client_cert(t.client_cert_file, f"{setting}.client_cert_file")
    try:
        ctx = ssl.create_default_context(cafile=str(t.ca_file) if t.ca_file else None)
        if t.client_cert_file and t.client_key_file:
            ctx.load_cert_chain(str(t.client_cert_file), str(t.client_key_file))
            _contexts.setdefault(t.client_cert_file.resolve(), weakref.WeakSet()).add(ctx)
    except (OSError, ssl.SSLError) as exc:
        raise SecretFileError(f"{setting}: {exc}") from exc
    return ctx


def nats_options(s: Settings) -> dict[str, Any]:
    """Extra `nats.connect` keyword arguments: TLS (with a client certificate for mutual
    TLS), this process's NATS identity (`nats_auth`, its secret read from its file now), and
    the identity's own inbox prefix (its permissions let it read replies there only, never
    `_INBOX.>`, so no identity reads another's replies: workers/nats_permissions.py). The
    user is `nats_auth.user`, or the user a `nats_url` names."""
    from workers.nats_inboxes import identity_inbox

    out: dict[str, Any] = {}
    a = s.nats_auth
    if a.user and a.password_file is not None:
        out["user"] = a.user
        out["password"] = read_secret(a.password_file, "nats_auth.password_file")
    for key, path, setting in (
        ("user_credentials", a.creds_file, "nats_auth.creds_file"),
        ("nkeys_seed", a.nkey_seed_file, "nats_auth.nkey_seed_file"),
    ):
        if path is not None:
            if not path.is_file():
                raise SecretFileError(f"{setting}: {path}: no such file")
            out[key] = str(path)
    if a.token_file is not None:
        out["token"] = read_secret(a.token_file, "nats_auth.token_file")
    user = a.user or unquote(urlsplit(s.nats_url.split(",")[0].strip()).username or "")
    if user:
        out["inbox_prefix"] = identity_inbox(user)
    ctx = ssl_context(s.nats_tls, "nats_tls")
    if ctx is not None:
        out["tls"] = ctx
        if s.nats_tls.server_name:
            out["tls_hostname"] = s.nats_tls.server_name
    return out


def kafka_config(k: KafkaSettings) -> dict[str, Any]:
    """librdkafka settings added to every producer, consumer and admin client."""
    out: dict[str, Any] = {}
    t = k.tls
    if t.enabled:
        out["security.protocol"] = "SASL_SSL" if k.sasl_username else "SSL"
        out["ssl.endpoint.identification.algorithm"] = "https"
        if t.ca_file:
            out["ssl.ca.location"] = str(t.ca_file)
        if t.client_cert_file and t.client_key_file:
            observe_client_cert(t.client_cert_file, "kafka.tls.client_cert_file")
            out["ssl.certificate.location"] = str(t.client_cert_file)
            out["ssl.key.location"] = str(t.client_key_file)
    elif k.sasl_username:
        out["security.protocol"] = "SASL_PLAINTEXT"
    if k.sasl_username:
        out["sasl.mechanism"] = k.sasl_mechanism
        out["sasl.username"] = k.sasl_username
        if k.sasl_password_file:
            out["sasl.password"] = read_secret(k.sasl_password_file, "kafka.sasl_password_file")
    return out


def postgres_conninfo(s: Settings) -> str:
    """`postgres_dsn` with the TLS settings and the password file's password added.

    The result may hold the password: pass it to psycopg, never print it (psycopg's own
    errors do not repeat it)."""
    p = s.postgres
    extra: dict[str, Any] = {}
    if p.sslmode:
        extra["sslmode"] = p.sslmode
    for key, path in (
        ("sslrootcert", p.sslrootcert_file),
        ("sslcert", p.sslcert_file),
        ("sslkey", p.sslkey_file),
    ):
        if path is not None:
            extra[key] = str(path)
    observe_client_cert(p.sslcert_file, "postgres.sslcert_file")
    if p.password_file is not None:
        extra["password"] = read_secret(p.password_file, "postgres.password_file")
    if not extra:
        return s.postgres_dsn
    from psycopg.conninfo import make_conninfo  # here: processes without PostgreSQL skip it

    return make_conninfo(s.postgres_dsn, **extra)


def ledger_options(s: Settings) -> dict[str, Any]:
    """Extra `clickhouse_connect.get_client` keyword arguments for a server ledger."""
    out: dict[str, Any] = {}
    t = s.ledger.tls
    if t.enabled:
        out["verify"] = True
        if t.ca_file:
            out["ca_cert"] = str(t.ca_file)
        if t.client_cert_file and t.client_key_file:
            observe_client_cert(t.client_cert_file, "ledger.tls.client_cert_file")
            out["client_cert"] = str(t.client_cert_file)
            out["client_cert_key"] = str(t.client_key_file)
        if t.server_name:
            out["server_host_name"] = t.server_name
    if s.ledger.password_file is not None:
        out["password"] = read_secret(s.ledger.password_file, "ledger.password_file")
    return out
