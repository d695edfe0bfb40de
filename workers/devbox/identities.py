"""The secure box's node identities and its revocation list (decision 0024).

Two files under `<data_dir>/secure/identities/`, both JSON, both written whole (a temporary
file renamed over the old one):
- `nodes.json`: the nodes enrolled with `sco dev certs node NODE --hall H`: each gets a
  client certificate whose URI SAN is `spiffe://sco/<region>/node/<node>` and a NATS user
  mapped from it with the agent's permissions (workers/nats_permissions.py `agent_user`);
- `revoked.json`: the SPIFFE IDs revoked with `sco dev certs revoke ID`. The box's NATS
  configuration maps no user to a revoked identity, so nats-server (`verify_and_map`)
  refuses its certificate from the next reload on: a new connection fails its handshake's
  authorization and a live one is closed by the reload.

Revocation is by identity: the box's issuer hands the same identity a new certificate
whenever it renews one, and NATS maps the identity, not the serial. The serials of the
identity's certificates found when it is revoked are recorded with it too (`certificates`):
they go into the issuing CA's CRL, which the box's PostgreSQL and nginx read (decision
0038). A revoked identity is never enrolled again (pick a new node name); it stays in the
list.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError

from workers.devbox.process import DevboxError

NODES_FILE = "nodes.json"
REVOKED_FILE = "revoked.json"


@runtime_checkable
class RevokingIssuer(Protocol):
    """An issuer that can also revoke what it issued (OpenBao's PKI: the certificates of an
    identity, so its CRL lists them, and the identity's token, so it issues no more).
    Optional beside `pki.CertificateIssuer`: `revoke` calls it when the box's issuer has it;
    it answers the certificates it revoked (or None)."""

    def revoke_identity(self, identity: str) -> list[RevokedCertificate] | None: ...


def node_kind(node: str) -> str:
    """The process kind in a node agent's SPIFFE ID (`spiffe://sco/<region>/node/<node>`)."""
    return f"node/{node}"


class EnrolledNode(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str
    hall: str
    node: str


class RevokedCertificate(BaseModel):
    """One certificate of a revoked identity: its serial (hex pairs joined by ':', as
    OpenBao writes them) and its issuer's common name (which CA's CRL lists it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    serial: str
    issuer: str
    not_after: datetime | None = None


class Revocation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    identity: str
    revoked_at: datetime
    reason: str = ""
    certificates: list[RevokedCertificate] = []


def _token(what: str, value: str) -> str:
    if not value or not all(ch.isalnum() or ch in "-_" for ch in value):
        raise DevboxError(f"{what} {value!r}: letters, digits, '-' or '_' only (a NATS token)")
    return value


class IdentityRegistry:
    """Enrolled nodes and revoked identities of one secure box."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def _read(self, name: str) -> list[dict[str, object]]:
        path = self.dir / name
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise DevboxError(f"{path}: unreadable ({exc}); fix or remove it") from exc
        if not isinstance(data, list):
            raise DevboxError(f"{path}: not a JSON list; fix or remove it")
        return data

    def _write(self, name: str, rows: list[BaseModel]) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.dir / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([r.model_dump(mode="json") for r in rows], indent=2) + "\n")
        os.replace(tmp, path)

    def nodes(self) -> list[EnrolledNode]:
        try:
            return [EnrolledNode.model_validate(r) for r in self._read(NODES_FILE)]
        except ValidationError as exc:
            raise DevboxError(f"{self.dir / NODES_FILE}: {exc.errors()[0]['msg']}") from exc

    def revoked(self) -> list[Revocation]:
        try:
            return [Revocation.model_validate(r) for r in self._read(REVOKED_FILE)]
        except ValidationError as exc:
            raise DevboxError(f"{self.dir / REVOKED_FILE}: {exc.errors()[0]['msg']}") from exc

    def revoked_ids(self) -> set[str]:
        return {r.identity for r in self.revoked()}

    def enrol(self, node: EnrolledNode, identity: str) -> bool:
        """Record `node` (True when new). A revoked identity is refused."""
        _token("node", node.node)
        _token("hall", node.hall)
        if identity in self.revoked_ids():
            raise DevboxError(f"{identity}: revoked; enrol the node under another name")
        nodes = self.nodes()
        for known in nodes:
            if known.region == node.region and known.node == node.node:
                if known.hall != node.hall:
                    raise DevboxError(
                        f"node {node.node} of {node.region}: enrolled in hall {known.hall}, "
                        f"not {node.hall}"
                    )
                return False
        self._write(NODES_FILE, [*nodes, node])
        return True

    def revoke(
        self,
        identity: str,
        reason: str,
        now: datetime | None = None,
        certificates: list[RevokedCertificate] | None = None,
    ) -> Revocation:
        """Add `identity` to the list (idempotent: the first revocation's time and reason are
        kept; `certificates` not yet recorded are added to it)."""
        if not identity.startswith("spiffe://"):
            raise DevboxError(f"{identity!r}: not a SPIFFE ID (spiffe://sco/<region>/<kind>)")
        rows = self.revoked()
        for i, r in enumerate(rows):
            if r.identity == identity:
                known = {(c.issuer, c.serial) for c in r.certificates}
                new = _unique([c for c in certificates or [] if (c.issuer, c.serial) not in known])
                if not new:
                    return r
                rows[i] = r.model_copy(update={"certificates": [*r.certificates, *new]})
                self._write(REVOKED_FILE, list(rows))
                return rows[i]
        row = Revocation(
            identity=identity,
            revoked_at=now or datetime.now(UTC),
            reason=reason,
            certificates=_unique(certificates or []),
        )
        self._write(REVOKED_FILE, [*rows, row])
        return row

    def revoked_serials(self, issuer: str) -> list[str]:
        """Every recorded serial `issuer` (a CA's common name) issued to a revoked identity."""
        return [c.serial for r in self.revoked() for c in r.certificates if c.issuer == issuer]


def _unique(certs: list[RevokedCertificate]) -> list[RevokedCertificate]:
    seen: dict[tuple[str, str], RevokedCertificate] = {}
    for c in certs:
        seen.setdefault((c.issuer, c.serial), c)
    return list(seen.values())
