"""OpenBao's PKI as a `CertificateSource` (contracts/cert_renewal.py): each fetch issues a
new certificate from the role of the process's kind (a hall's relay: its hall's), logged
in with the token its auth method gave it (a file, read at each fetch so a renewed token is
picked up)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from contracts.cert_renewal import CertBundle, bundle_validity
from workers.openbao.client import BaoClient
from workers.openbao.provision import issue


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
    ) -> None:
        self._client = client
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
    ) -> OpenBaoSource:
        return cls(
            lambda: BaoClient.from_files(address, token_file=token_file, ca_file=ca_file),
            region,
            kind,
            ttl_s=ttl_s,
        )

    def fetch(self) -> CertBundle:
        got = issue(
            self._client(), self.region, self.kind, instance=self.instance, ttl_s=self.ttl_s
        )
        # The leaf and the region's intermediate: a peer that trusts the root (the trust
        # bundle) builds the chain from what the client presents.
        chain = _pems(got.ca_chain)
        cert_pem = (got.certificate.strip() + "\n" + "".join(chain[:-1] or chain)).encode()
        not_before, not_after = bundle_validity(cert_pem)
        return CertBundle(
            cert_pem=cert_pem,
            key_pem=(got.private_key.strip() + "\n").encode(),
            not_before=not_before,
            not_after=not_after,
            identity=got.spiffe_id,
        )


def _pems(text: str) -> list[str]:
    """The PEM blocks in `text`, each ending in a newline."""
    end = "-----END CERTIFICATE-----"
    return [b.strip() + "\n" + end + "\n" for b in text.split(end) if "BEGIN" in b]
