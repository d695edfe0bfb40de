"""The secure box's certificate revocation lists (decision 0038).

`sco dev certs revoke ID` puts the serials of the identity's certificates in a CRL of the CA
that issued them: the box CA signs its own CRL here, OpenBao's PKI revokes its own and
publishes its CRL (`<mount>/crl/pem`). The box's PostgreSQL (`ssl_crl_file`) and nginx
(`ssl_crl`) read one file with every CRL of the trust bundle: both then check every
certificate of a client's chain (OpenSSL's CRL_CHECK_ALL), so a CA of the bundle without a
CRL in the file would fail every client it issued ("unable to get certificate CRL"), and an
expired CRL would too ("CRL has expired"). Hence one CRL per CA, always, empty or not, each
renewed well before its next update.

Pure apart from reading and writing the files given; the callers reload the servers.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from workers.devbox.pki import BoxCA

#: The box CA's CRL is valid this long, and signed again when less than REFRESH_WITHIN is
#: left (each `up` and each revocation looks).
CRL_LIFETIME = dt.timedelta(days=30)
REFRESH_WITHIN = dt.timedelta(days=2)
#: The name of the box CA's part in the CRL directory.
BOX_CA_PART = "box-ca"


def serial_text(serial: int) -> str:
    """A serial as OpenBao writes it: lowercase hex byte pairs joined by ':'."""
    raw = serial.to_bytes((serial.bit_length() + 7) // 8 or 1, "big")
    return ":".join(f"{b:02x}" for b in raw)


def serial_int(text: str) -> int:
    return int(text.replace(":", "").replace("-", ""), 16)


def issuer_cn(cert: x509.Certificate) -> str:
    names = cert.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


def read_certificate(path: Path) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return None


def box_ca_crl(
    ca: BoxCA, serials: Iterable[int], previous: bytes | None, now: dt.datetime | None = None
) -> bytes:
    """The box CA's CRL (PEM) listing `serials`: `previous` again when it lists the same
    serials, is the CA's and has more than REFRESH_WITHIN left, else a new one."""
    now = now or dt.datetime.now(dt.UTC)
    wanted = sorted(set(serials))
    ca_cert, ca_key = ca.authority()
    if previous:
        try:
            old = x509.load_pem_x509_crl(previous)
        except ValueError:
            old = None
        if (
            old is not None
            and old.issuer == ca_cert.subject
            and old.is_signature_valid(ca_key.public_key())
            and old.next_update_utc is not None
            and old.next_update_utc - now > REFRESH_WITHIN
            and sorted(r.serial_number for r in old) == wanted
        ):
            return previous
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now - dt.timedelta(minutes=1))
        .next_update(now + CRL_LIFETIME)
        .add_extension(x509.CRLNumber(int(now.timestamp() * 1000)), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    for serial in wanted:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder()
            .serial_number(serial)
            .revocation_date(now - dt.timedelta(minutes=1))
            .build()
        )
    crl = builder.sign(ca_key, hashes.SHA256())
    return crl.public_bytes(serialization.Encoding.PEM)


def write_if_changed(path: Path, data: bytes) -> bool:
    """Write `data` whole (a temporary file renamed over the old one); False if equal."""
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    os.replace(tmp, path)
    return True


def crl_summary(path: Path, now: dt.datetime | None = None) -> str:
    """`sco dev status`: how many serials the CRL file revokes, its oldest CRL's age and
    the soonest next update (an expired CRL refuses every client of its CA)."""
    now = now or dt.datetime.now(dt.UTC)
    try:
        text = path.read_bytes()
    except OSError:
        return "no CRL"
    crls = []
    for block in text.split(b"-----END X509 CRL-----"):
        if b"-----BEGIN X509 CRL-----" in block:
            try:
                crls.append(x509.load_pem_x509_crl(block + b"-----END X509 CRL-----\n"))
            except ValueError:
                return f"CRL {path} unreadable"
    if not crls:
        return "no CRL"
    revoked = sum(len(list(c)) for c in crls)
    age = max(now - c.last_update_utc for c in crls)
    nexts = [c.next_update_utc for c in crls if c.next_update_utc is not None]
    left = min(nexts) - now if nexts else None
    due = f", next update in {int(left.total_seconds())} s" if left is not None else ""
    state = " EXPIRED" if left is not None and left.total_seconds() <= 0 else ""
    return f"CRL{state}: {len(crls)} CAs, {revoked} revoked, age {int(age.total_seconds())} s{due}"
