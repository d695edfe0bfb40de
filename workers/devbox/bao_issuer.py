"""The secure box's identities from OpenBao's PKI (`box.secure_cert_source = "openbao"`).

A `CertificateIssuer` (workers/devbox/pki.py) beside the box CA:
- `issue(kind, region)`: a process kind with an OpenBao role (workers/openbao/plan.py:
  PROCESS_KINDS; a hall's relay from its hall's role) gets its certificate from that role,
  issued with a token of its own (policy `sco-<region>-<kind>`: it may issue from its own
  role and nothing else), written where the box CA would write it, so the file layout of
  the secure box is the same whichever source issues. The process renews it itself
  (`identity` settings, contracts/cert_renewal.py).
- The identities OpenBao has no role for (the box's own probes, the operator's `sco`) and
  the listeners' server certificates stay the box CA's: the roles issue URI SANs only,
  never host names.
- `ca_file`: the trust bundle every server and client of the box verifies with, the box CA
  and OpenBao's root and regional intermediates (`<pki>/trust-bundle.crt`).
- `revoke_identity`: every unexpired certificate OpenBao issued to an identity is revoked
  there (its regional CRL lists it) and the identity's token too (its process renews no
  more); `crls`: the CRL of each of OpenBao's CAs in the bundle, for the box's PostgreSQL
  and nginx (decision 0038).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Sequence
from pathlib import Path

from contracts.cert_renewal import read_validity, write_pair
from workers.devbox.identities import RevokedCertificate
from workers.devbox.pki import BoxCA, Issued
from workers.devbox.process import DevboxError
from workers.openbao.client import BaoClient, BaoError
from workers.openbao.plan import PROCESS_KINDS, ROOT_MOUNT, pki_mount, policy_name
from workers.openbao.source import OpenBaoSource, split_kind
from workers.settings import Settings

#: What a box-made token for one kind lives: OpenBao's default maximum (32 days); `up`
#: makes a new one when the one on disk is older than TOKEN_RENEW_AFTER_S.
TOKEN_TTL = "768h"
TOKEN_RENEW_AFTER_S = 28 * 86400
BUNDLE = "trust-bundle.crt"
#: How long a CRL of OpenBao's is valid (its default is 72 h): the box's servers refuse
#: every client of a CA whose CRL has expired, and the box renews them at `up` and `revoke`.
CRL_EXPIRY = "720h"
CRL_REFRESH_WITHIN = dt.timedelta(hours=360)


def has_role(kind: str) -> bool:
    return split_kind(kind)[0] in PROCESS_KINDS


def issuer_name(cert_path: Path) -> str:
    """The issuer's common name of a certificate file ('' if unreadable)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError):
        return ""
    names = cert.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


class OpenBaoIssuer:
    """Process identities from OpenBao, the rest from `fallback` (module docstring)."""

    source = "openbao"

    def __init__(
        self,
        settings: Settings,
        fallback: BoxCA,
        secrets_dir: Path,
        *,
        ttl_s: int,
        renew_fraction: float,
    ) -> None:
        self.s = settings
        self.fallback = fallback
        self.secrets_dir = secrets_dir
        self.ttl_s = ttl_s
        self.renew_fraction = renew_fraction

    # -- OpenBao -----------------------------------------------------------------------------

    def _root(self) -> BaoClient:
        from workers.devbox import openbao

        return openbao.client(self.s)

    @property
    def bao_ca_file(self) -> Path | None:
        from workers.devbox import openbao

        return openbao.ca_file(self.s)

    def token_file(self, kind: str, region: str) -> Path:
        """A token whose only policy is the kind's (a hall's relay: its hall's), made once
        with the box's root token and kept 0600: what Kubernetes or AppRole login gives a
        process in production (deploy/openbao/auth.sh)."""
        path = self._token_path(kind, region)
        if not path.is_file() or time.time() - path.stat().st_mtime > TOKEN_RENEW_AFTER_S:
            from workers.devbox.pki import write_private

            try:
                policy = path.name.removeprefix("openbao-").removesuffix(".token")
                token = self._root().create_token([policy], ttl=TOKEN_TTL)
            except BaoError as exc:
                raise DevboxError(f"openbao: a token for {kind} of {region}: {exc}") from exc
            write_private(path, (token + "\n").encode())
        return path

    def _token_path(self, kind: str, region: str) -> Path:
        base, hall = split_kind(kind)
        name = policy_name(region, base, hall if base == "notice-relay" else None)
        return self.secrets_dir / f"openbao-{name}.token"

    def source_for(self, kind: str, region: str, key_file: Path | None = None) -> OpenBaoSource:
        return OpenBaoSource.from_files(
            self.s.openbao.address,
            token_file=self.token_file(kind, region),
            ca_file=self.bao_ca_file,
            region=region,
            kind=kind,
            ttl_s=self.ttl_s,
            key_file=key_file,
        )

    # -- CertificateIssuer -------------------------------------------------------------------

    @property
    def ca_file(self) -> Path:
        """The box CA and OpenBao's CAs in one file, rewritten when OpenBao answers (a
        server starting reads it then); the last one written otherwise."""
        path = self.fallback.dir / BUNDLE
        pems = [self.fallback.ca_file.read_text()]
        try:
            root = self._root()
            for mount in [ROOT_MOUNT, *(pki_mount(r) for r in self.s.regions)]:
                data = root.read(f"{mount}/cert/ca")
                if data and data.get("certificate"):
                    pems.append(str(data["certificate"]).strip() + "\n")
        except BaoError:
            if path.is_file():
                return path
        text = "".join(pems)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
        return path

    def issue(self, kind: str, region: str) -> Issued:
        if not has_role(kind):
            return self.fallback.issue(kind, region)
        # The box CA's file names: the same layout whichever source issues.
        stem = "client-" + f"{region}-{kind}".replace("/", "-")
        cert, key = self.fallback.dir / f"{stem}.crt", self.fallback.dir / f"{stem}.key"
        validity = read_validity(cert)
        if validity is not None and key.is_file() and "intermediate" in issuer_name(cert):
            nb, na = validity
            if dt.datetime.now(dt.UTC) < nb + (na - nb) * self.renew_fraction:
                return Issued(cert, key)
        try:
            bundle = self.source_for(kind, region, key).fetch()
        except BaoError as exc:
            raise DevboxError(f"openbao: a certificate for {kind} of {region}: {exc}") from exc
        self.fallback.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_pair(bundle, cert, key)
        return Issued(cert, key)

    def issue_server(self, name: str, hosts: Sequence[str]) -> Issued:
        return self.fallback.issue_server(name, hosts)

    # -- revocation (decision 0038) -----------------------------------------------------------

    def _mounts(self) -> list[str]:
        """OpenBao's CAs in the trust bundle: the root's mount and each region's."""
        return [ROOT_MOUNT, *(pki_mount(r) for r in self.s.regions)]

    def revoke_identity(self, identity: str) -> list[RevokedCertificate]:
        """Revoke the identity's token (no renewal any more) and every unexpired certificate
        of its region's intermediate whose URI SAN is `identity`; answers those revoked now
        or before (idempotent)."""
        parts = identity.removeprefix("spiffe://").split("/", 2)
        if len(parts) < 3 or not has_role(parts[2]):
            return []
        region, kind = parts[1], parts[2]
        try:
            root = self._root()
            token = self._token_path(kind, region)
            if token.is_file():
                with contextlib.suppress(BaoError):  # already gone: nothing to revoke
                    root.write("auth/token/revoke", {"token": token.read_text().strip()})
            token.unlink(missing_ok=True)
            return self._revoke_certificates(root, pki_mount(region), identity)
        except BaoError as exc:
            raise DevboxError(f"openbao: revoking {identity}: {exc}") from exc

    def _revoke_certificates(
        self, root: BaoClient, mount: str, identity: str
    ) -> list[RevokedCertificate]:
        from cryptography import x509

        from workers.devbox.crl import issuer_cn

        now = dt.datetime.now(dt.UTC)
        out: list[RevokedCertificate] = []
        for serial in root.list_keys(f"{mount}/certs"):
            data = root.read(f"{mount}/cert/{serial}")
            if not data or not data.get("certificate"):
                continue
            cert = x509.load_pem_x509_certificate(str(data["certificate"]).encode())
            if cert.not_valid_after_utc <= now or _uris(cert) != [identity]:
                continue
            if not int(data.get("revocation_time") or 0):
                root.write(f"{mount}/revoke", {"serial_number": serial})
            out.append(
                RevokedCertificate(
                    serial=serial.replace("-", ":").lower(),
                    issuer=issuer_cn(cert),
                    not_after=cert.not_valid_after_utc,
                )
            )
        return out

    def crls(self) -> dict[str, bytes]:
        """Each of OpenBao's CAs' CRL (PEM), by mount: made valid for CRL_EXPIRY, and
        rebuilt when less than half of that is left."""
        from cryptography import x509

        out: dict[str, bytes] = {}
        try:
            root = self._root()
            for mount in self._mounts():
                conf = root.read(f"{mount}/config/crl") or {}
                if str(conf.get("expiry")) != CRL_EXPIRY:
                    root.write(f"{mount}/config/crl", {"expiry": CRL_EXPIRY})
                    root.read(f"{mount}/crl/rotate")
                pem = root.read_raw(f"{mount}/crl/pem")
                crl = x509.load_pem_x509_crl(pem)
                left = (crl.next_update_utc or dt.datetime.now(dt.UTC)) - dt.datetime.now(dt.UTC)
                if left < CRL_REFRESH_WITHIN:
                    root.read(f"{mount}/crl/rotate")
                    pem = root.read_raw(f"{mount}/crl/pem")
                out[mount] = pem
        except (BaoError, ValueError) as exc:
            raise DevboxError(f"openbao: the CRLs: {exc}") from exc
        return out


def _uris(cert: object) -> list[str]:
    from cryptography import x509

    assert isinstance(cert, x509.Certificate)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(u) for u in san.get_values_for_type(x509.UniformResourceIdentifier)]


def certificate_detail(cert_path: Path) -> str:
    """`sco dev status`: who issued a process's certificate and until when."""
    validity = read_validity(cert_path)
    if validity is None:
        return "no certificate"
    source = "openbao" if "intermediate" in issuer_name(cert_path) else "box CA"
    left = validity[1] - dt.datetime.now(dt.UTC)
    return (
        f"cert {source}, not_after {validity[1].isoformat(timespec='seconds')} "
        f"({int(left.total_seconds())} s left)"
    )
