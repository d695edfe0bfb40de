"""The signed contract bundle: canonical JSON, Ed25519, a monotonic serial.

File layout (canonical JSON: sorted keys, no whitespace, UTF-8):
    {"content": {"contracts": [...], "created_at": "...", "format": 1,
                 "notice_policies": [...], "regions": [...], "serial": N},
     "key_id": "<16 hex>", "signature": "<hex Ed25519 over canonical(content)>"}
The same input gives the same bytes (Ed25519 signatures are deterministic). A verifier
accepts only the canonical form, so any changed byte is refused.
`notice_policies` (one per region that has notice-signing keys) is how nodes learn who
may sign their reclaim notices; bundles from before it read as having none.
`source` (bundles compiled by `sco contracts sync`) names the git commit the contracts came
from and who signed it; absent (and not in the bytes) for bundles compiled from a directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from nacl.signing import SigningKey
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
)

from contracts import signed_bundle
from contracts.cache import BundleCache
from contracts.canonical import canonical_json as canonical_json
from contracts.canonical import signed_envelope as signed_envelope
from contracts.keys import KeyFileError, TrustStore
from contracts.model import Contract
from contracts.node_bundle import NodeBundle, parse_node_content
from contracts.notice import NoticePolicy
from contracts.records import RecordError
from contracts.signed_bundle import FORMAT as FORMAT
from contracts.signed_bundle import MAX_SERIAL as MAX_SERIAL
from contracts.signed_bundle import BundleRejected as BundleRejected


def _policy(value: object) -> NoticePolicy:
    if isinstance(value, NoticePolicy):
        return value
    try:
        return NoticePolicy.from_json(value, "")
    except RecordError as exc:
        raise ValueError(str(exc)) from None


#: A notice policy in a pydantic model: checked and written by the record's own code.
PolicyField = Annotated[
    NoticePolicy, PlainValidator(_policy), PlainSerializer(lambda p: p.to_json())
]


class BundleSource(BaseModel):
    """The git commit a bundle was compiled from (`sco contracts sync`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    commit: str  # full commit id
    signer: str  # the allowed_signers principal whose SSH key signed the commit
    signer_key: str = ""  # that key's fingerprint (SHA256:...)
    remote: str = ""  # the remote it was fetched from (primary or a mirror)
    ref: str = ""
    path: str = ""  # the contracts folder inside the repository


class BundleContent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1] = FORMAT
    serial: int = Field(ge=1, le=MAX_SERIAL)
    created_at: AwareDatetime
    regions: list[str]
    contracts: list[Contract]
    notice_policies: list[PolicyField] = []
    source: BundleSource | None = None

    def notice_policy(self, region: str) -> NoticePolicy | None:
        return next((p for p in self.notice_policies if p.region == region), None)

    def contract(self, name: str) -> Contract | None:
        return next((c for c in self.contracts if c.name == name), None)

    def as_node(self) -> NodeBundle:
        """This content as a node reads it from the signed bytes (contracts/node_bundle.py)."""
        doc = self.model_dump(mode="json")
        if doc["source"] is None:
            del doc["source"]
        return parse_node_content(doc)


def build(
    contracts: Sequence[Contract],
    *,
    serial: int,
    created_at: datetime,
    key: SigningKey,
    notice_policies: Sequence[NoticePolicy] = (),
    source: BundleSource | None = None,
) -> bytes:
    content = BundleContent(
        serial=serial,
        created_at=created_at.astimezone(UTC),
        regions=sorted({r for c in contracts for r in c.regions}),
        contracts=sorted(contracts, key=lambda c: c.name),
        notice_policies=sorted(notice_policies, key=lambda p: p.region),
        source=source,
    )
    content_json = content.model_dump(mode="json")
    if not content.notice_policies:
        # Without notice keys the bytes stay those of a bundle from before they existed.
        del content_json["notice_policies"]
    if content.source is None:
        del content_json["source"]  # likewise for bundles not compiled from git
    return signed_envelope("content", content_json, key)


#: A bundle whose content the control plane validated (every contract rule).
VerifiedBundle = signed_bundle.VerifiedBundle[BundleContent]


def parse_content(doc: dict[str, Any]) -> BundleContent:
    """Signed content as the control plane reads it: every rule of the contract model."""
    try:
        # strict=False: JSON has strings where the models hold enums; the content is signed.
        return BundleContent.model_validate(doc, strict=False)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "-"
        raise BundleRejected(
            f"signed content does not match the bundle format: {where}: {first['msg']} "
            f"({exc.error_count()} error(s))"
        ) from None


def verify(
    raw: bytes,
    trust: TrustStore,
    *,
    now: datetime | None = None,
    max_age: timedelta = timedelta(hours=24),
) -> VerifiedBundle:
    """`raw` opened (size, form, key, signature, canonical; contracts/signed_bundle.py) and
    its content validated as BundleContent. BundleRejected with the reason."""
    return signed_bundle.verify_as(raw, trust, parse_content, now=now, max_age=max_age)


def installed_bundle(cache_dir: Path, trust_dir: Path) -> tuple[VerifiedBundle | None, str]:
    """The bundle installed in `cache_dir`, verified against `trust_dir`, or None and why.

    What the control plane plans from and the CLI checks against; nodes use the cache
    directly.
    """
    try:
        trust = TrustStore.load(trust_dir)
    except KeyFileError as exc:
        return None, f"contract trust: {exc}"
    bundle = BundleCache(cache_dir, trust, parse=parse_content).current()
    if bundle is None:
        return None, (
            f"no valid contract bundle in {cache_dir} "
            "(install one with `sco contracts install BUNDLE`)"
        )
    return bundle, ""
