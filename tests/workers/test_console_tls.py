"""`sco console` behind its own TLS: with `console.client_ca_file` only an operator whose
client certificate that CA signed gets an answer; no certificate, or one of another CA, is
refused in the handshake; a client that never finishes its handshake holds up nobody."""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from workers.console.server import make_server
from workers.settings import ConsoleSettings, Settings

pytestmark = pytest.mark.timeout(60)


@dataclass
class Issued:
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(dir: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    c, k = dir / f"{stem}.crt", dir / f"{stem}.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Issued(c, k)


def _ca(dir: Path, cn: str) -> tuple[Issued, x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return _write(dir, cn, cert, key), cert, key


def _leaf(
    dir: Path, cn: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, server: bool
) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return _write(dir, cn, builder.sign(ca_key, hashes.SHA256()), key)


@dataclass
class Console:
    url: str
    ca: Path
    operator: Issued
    stranger: Issued


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    ca, ca_cert, ca_key = _ca(tmp_path, "sco-operators-ca")
    _, other_cert, other_key = _ca(tmp_path, "someone-elses-ca")
    server = _leaf(tmp_path, "console", ca_cert, ca_key, server=True)
    s = Settings(
        console=ConsoleSettings(cert_file=server.cert, key_file=server.key, client_ca_file=ca.cert)
    )
    httpd = make_server(s, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield Console(
            url=f"https://127.0.0.1:{httpd.server_address[1]}/healthz",
            ca=ca.cert,
            operator=_leaf(tmp_path, "dana", ca_cert, ca_key, server=False),
            stranger=_leaf(tmp_path, "mallory", other_cert, other_key, server=False),
        )
    finally:
        httpd.shutdown()
        httpd.server_close()


def _get(c: Console, client: Issued | None) -> int:
    context = ssl.create_default_context(cafile=c.ca)
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    with urllib.request.urlopen(c.url, context=context, timeout=10) as resp:
        return int(resp.status)


def test_an_operator_with_a_certificate_of_the_ca_gets_an_answer(console: Console) -> None:
    assert _get(console, console.operator) == 200


@pytest.mark.parametrize("who", ["nobody", "stranger"])
def test_no_certificate_or_another_cas_is_refused(console: Console, who: str) -> None:
    client = None if who == "nobody" else console.stranger
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _get(console, client)


def test_plain_http_gets_nothing(console: Console) -> None:
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(console.url.replace("https", "http"), timeout=10).read()


def test_a_client_stuck_in_its_handshake_holds_up_nobody(console: Console) -> None:
    port = int(console.url.split(":")[2].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=10):
        # connected, never says hello: the operator is still answered meanwhile
        assert _get(console, console.operator) == 200


def test_half_configured_tls_is_a_settings_error() -> None:
    with pytest.raises(ValueError, match="go together"):
        ConsoleSettings(cert_file=Path("a.crt"))
    with pytest.raises(ValueError, match=r"needs console\.cert_file"):
        ConsoleSettings(client_ca_file=Path("ca.crt"))
