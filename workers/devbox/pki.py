"""The secure box's certificate authority: one CA under `<data_dir>/secure/pki`, a client
certificate per process kind whose URI SAN is its SPIFFE ID (`spiffe://sco/<region>/<kind>`),
and server certificates for the box's TLS listeners.

The box asks only `CertificateIssuer` (issue one identity's certificate, give the CA that
verifies it), so another source, OpenBao's PKI engine or a SPIRE Workload API, can take
its place without the box changing.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: A certificate is issued again when it would expire within this (and on each `up`
#: otherwise reused): the box runs for days, never on an expired certificate after a restart.
RENEW_WITHIN = dt.timedelta(days=2)
LIFETIME = dt.timedelta(days=30)
CA_LIFETIME = dt.timedelta(days=3650)


@dataclass(frozen=True)
class Issued:
    cert_path: Path
    key_path: Path


def spiffe_id(kind: str, region: str) -> str:
    """The identity a certificate of `kind` in `region` carries (its URI SAN)."""
    return f"spiffe://sco/{region}/{kind}"


class CertificateIssuer(Protocol):
    """Where the box's identities come from. `issue` returns a certificate and key that
    are current (issued anew when missing or near expiry); `ca_file` verifies every
    certificate this issuer gives, servers' and clients' alike."""

    @property
    def ca_file(self) -> Path: ...

    def issue(self, kind: str, region: str) -> Issued:
        """A client certificate for process kind `kind` of `region` (SPIFFE URI SAN)."""
        ...

    def issue_server(self, name: str, hosts: Sequence[str]) -> Issued:
        """A server certificate for the listener `name`, valid for `hosts` (names or IPs)."""
        ...


def write_private(path: Path, data: bytes) -> None:
    """Keys are 0600 from the first byte (never world-readable, not even briefly)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    tmp.replace(path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _current(cert_path: Path, key_path: Path, now: dt.datetime) -> bool:
    if not (cert_path.is_file() and key_path.is_file()):
        return False
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError:
        return False
    return cert.not_valid_after_utc - now > RENEW_WITHIN


_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


class BoxCA:
    """A CA of the box's own, made once (ECDSA P-256; keys 0600 in a 0700 directory)."""

    def __init__(self, directory: Path, name: str = "sco box CA") -> None:
        self.dir = directory
        self._name = name

    @property
    def ca_file(self) -> Path:
        self._ensure_ca()
        return self.dir / "ca.crt"

    def authority(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """The CA's certificate and key (made on first use): what signs its CRL too."""
        return self._ensure_ca()

    def _ensure_ca(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        cert_path, key_path = self.dir / "ca.crt", self.dir / "ca.key"
        if cert_path.is_file() and key_path.is_file():
            key = serialization.load_pem_private_key(key_path.read_bytes(), None)
            assert isinstance(key, ec.EllipticCurvePrivateKey)
            return x509.load_pem_x509_certificate(cert_path.read_bytes()), key
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self._name)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_CA_KEY_USAGE, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        write_private(key_path, _key_pem(key))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cert, key

    def _sign(
        self,
        stem: str,
        common_name: str,
        sans: list[x509.GeneralName],
        usage: x509.ObjectIdentifier,
    ) -> Issued:
        cert_path, key_path = self.dir / f"{stem}.crt", self.dir / f"{stem}.key"
        now = dt.datetime.now(dt.UTC)
        if _current(cert_path, key_path, now):
            return Issued(cert_path, key_path)
        ca_cert, ca_key = self._ensure_ca()
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + LIFETIME)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        write_private(key_path, _key_pem(key))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return Issued(cert_path, key_path)

    def issue(self, kind: str, region: str) -> Issued:
        identity = spiffe_id(kind, region)
        stem = "client-" + f"{region}-{kind}".replace("/", "-")
        return self._sign(
            stem,
            f"{kind}.{region}",
            [x509.UniformResourceIdentifier(identity)],
            ExtendedKeyUsageOID.CLIENT_AUTH,
        )

    def issue_server(self, name: str, hosts: Sequence[str]) -> Issued:
        sans: list[x509.GeneralName] = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        return self._sign(f"server-{name}", name, sans, ExtendedKeyUsageOID.SERVER_AUTH)


def certificate_identity(cert_path: Path) -> list[str]:
    """The URI SANs of a certificate (its SPIFFE IDs)."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(u) for u in san.get_values_for_type(x509.UniformResourceIdentifier)]
