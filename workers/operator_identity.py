"""Who an operator is, beyond the free-text `--by`: the subject of the client certificate
the command presents to Temporal. With mTLS the proxy in front of Temporal has verified
that certificate, so the subject is an authenticated identity; without a client
certificate there is none ("")."""

from __future__ import annotations

from pathlib import Path

from workers.settings import Settings


class IdentityError(ValueError):
    """The configured client certificate cannot be read; the message names the file."""


def certificate_subject(cert_file: Path) -> str:
    """The certificate's subject as an RFC 4514 string, e.g. "CN=dana,O=sco-operators"."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except OSError as exc:
        raise IdentityError(f"{cert_file}: {exc.strerror}") from exc
    except ValueError as exc:
        raise IdentityError(f"{cert_file}: not a PEM certificate ({exc})") from exc
    return cert.subject.rfc4514_string()


def operator_identity(s: Settings) -> str:
    cert = s.temporal.tls.client_cert_file
    return certificate_subject(cert) if cert is not None else ""
