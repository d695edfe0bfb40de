"""OpenBao's PKI as a `CertificateSource` (contracts/cert_renewal.py): each fetch issues a
new certificate from the role of the process's kind (a hall's relay: its hall's), logged
in with the token its auth method gave it (a file, read at each fetch so a renewed token is
picked up)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from contracts.cert_renewal import CertBundle, bundle_validity
from workers.openbao.client import BaoClient
from workers.openbao.plan import spiffe_id
from workers.openbao.provision import issue, sign


def split_kind(kind: str) -> tuple[str, str | None]:
    """'notice-relay/A' → ('notice-relay', 'A'); 'agent/node-1' → ('agent', 'node-1')."""
    base, _, instance = kind.partition("/")
    return base, instance or None


class OpenBaoSource:
    """Certificates of `kind` in `region` from `pki_<region>/issue/<role>`."""

    name = "openbao"

    def __init__(
        self,
        client: Callable[[], BaoClient],
        region: str,
        kind: str,
        *,
        ttl_s: int | None = None,
        key_file: Path | None = None,
    ) -> None:
        self._client = client
        # Where the process's key is: a renewal keeps it (a CSR signed by the role), so
        # the key file never changes under a reader (libpq opens cert and key apart).
        self.key_file = key_file
        self.region = region
        self.kind, self.instance = split_kind(kind)
        self.ttl_s = ttl_s

    @classmethod
    def from_files(
        cls,
        address: str,
        *,
        token_file: Path,
        ca_file: Path | None,
        region: str,
        kind: str,
        ttl_s: int | None = None,
        key_file: Path | None = None,
    ) -> OpenBaoSource:
        return cls(
            lambda: BaoClient.from_files(address, token_file=token_file, ca_file=ca_file),
            region,
            kind,
            ttl_s=ttl_s,
            key_file=key_file,
        )

    def _own_key(self) -> bytes | None:
        """The key in hand (PEM), if there is a usable one."""
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        if self.key_file is None:
            return None
        try:
            pem = self.key_file.read_bytes()
            load_pem_private_key(pem, None)
        except (OSError, ValueError, TypeError):
            return None
        return pem

    def fetch(self) -> CertBundle:
        key_pem = self._own_key()
        if key_pem is None:  # the first certificate: OpenBao makes the key
            got = issue(
                self._client(), self.region, self.kind, instance=self.instance, ttl_s=self.ttl_s
            )
            key_pem = (got.private_key.strip() + "\n").encode()
        else:
            got = sign(
                self._client(), self.region, self.kind,
                _csr(key_pem, spiffe_id(self.region, self.kind, self.instance)),
                instance=self.instance, ttl_s=self.ttl_s,
            )  # fmt: skip
        # The leaf and the region's intermediate: a peer that trusts the root (the trust
        # bundle) builds the chain from what the client presents.
        chain = _pems(got.ca_chain)
        cert_pem = (got.certificate.strip() + "\n" + "".join(chain[:-1] or chain)).encode()
        not_before, not_after = bundle_validity(cert_pem)
        return CertBundle(
            cert_pem=cert_pem,
            key_pem=key_pem,
            not_before=not_before,
            not_after=not_after,
            identity=got.spiffe_id,
        )


def _pems(text: str) -> list[str]:
    """The PEM blocks in `text`, each ending in a newline."""
    end = "-----END CERTIFICATE-----"
    return [b.strip() + "\n" + end + "\n" for b in text.split(end) if "BEGIN" in b]


def _csr(key_pem: bytes, uri: str) -> str:
    """A CSR for the key asking for its SPIFFE ID (the role refuses any other), subject
    empty (the role allows no common name). OpenBao's `sign` takes the SANs from the CSR:
    with `use_csr_sans` off it ignored `uri_sans` and issued a certificate without one."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = serialization.load_pem_private_key(key_pem, None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode()
