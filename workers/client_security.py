"""TLS and credentials for every client SCO makes, from settings.

Secrets are files (a Kubernetes Secret mount) read here, when a client is made, and handed
straight to the client library; settings hold only paths, so printing settings (`repr`,
`sco dev status`, logs) never shows a secret.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from psycopg.conninfo import make_conninfo

from workers.settings import KafkaSettings, Settings, TLSSettings


class SecretFileError(ValueError):
    """A configured secret or certificate file cannot be read; names setting and file."""


def read_file(path: Path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SecretFileError(f"{setting}: {path}: {exc.strerror}") from exc


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
    try:
        ctx = ssl.create_default_context(cafile=str(t.ca_file) if t.ca_file else None)
        if t.client_cert_file and t.client_key_file:
            ctx.load_cert_chain(str(t.client_cert_file), str(t.client_key_file))
    except (OSError, ssl.SSLError) as exc:
        raise SecretFileError(f"{setting}: {exc}") from exc
    return ctx


def nats_options(s: Settings) -> dict[str, Any]:
    """Extra `nats.connect` keyword arguments."""
    ctx = ssl_context(s.nats_tls, "nats_tls")
    if ctx is None:
        return {}
    out: dict[str, Any] = {"tls": ctx}
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
    if p.password_file is not None:
        extra["password"] = read_secret(p.password_file, "postgres.password_file")
    return make_conninfo(s.postgres_dsn, **extra) if extra else s.postgres_dsn


def ledger_options(s: Settings) -> dict[str, Any]:
    """Extra `clickhouse_connect.get_client` keyword arguments for a server ledger."""
    out: dict[str, Any] = {}
    t = s.ledger.tls
    if t.enabled:
        out["verify"] = True
        if t.ca_file:
            out["ca_cert"] = str(t.ca_file)
        if t.client_cert_file and t.client_key_file:
            out["client_cert"] = str(t.client_cert_file)
            out["client_cert_key"] = str(t.client_key_file)
        if t.server_name:
            out["server_host_name"] = t.server_name
    if s.ledger.password_file is not None:
        out["password"] = read_secret(s.ledger.password_file, "ledger.password_file")
    return out
