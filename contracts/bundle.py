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

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from nacl.signing import SigningKey
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from contracts.bounded import MAX_BUNDLE_BYTES, InputRejected, loads
from contracts.canonical import canonical_json as canonical_json
from contracts.canonical import signed_envelope as signed_envelope
from contracts.keys import SignatureRefused, TrustStore
from contracts.model import Contract
from contracts.notice import NoticePolicy

FORMAT: Literal[1] = 1
#: The highest serial a bundle may carry (2**53: exact in every JSON reader). With the
#: bounded step of the cache (contracts/cache.py) no bundle can lock out the ones after it.
MAX_SERIAL = 2**53
#: The canonical envelope, matched on the raw bytes: the signature is checked over the
#: signed content's own bytes before any JSON parser sees them.
_ENVELOPE = re.compile(
    rb'\{"content":(?P<content>.*),"key_id":"(?P<kid>[0-9a-f]{16})",'
    rb'"signature":"(?P<sig>[0-9a-f]{128})"\}',
    re.DOTALL,
)


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
    notice_policies: list[NoticePolicy] = []
    source: BundleSource | None = None

    def notice_policy(self, region: str) -> NoticePolicy | None:
        return next((p for p in self.notice_policies if p.region == region), None)

    def contract(self, name: str) -> Contract | None:
        return next((c for c in self.contracts if c.name == name), None)


class BundleRejected(ValueError):
    """The bundle must not be used; the message says why."""


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


@dataclass(frozen=True)
class VerifiedBundle:
    content: BundleContent
    key_id: str
    raw: bytes
    stale: bool  # older than the verifier's max age: still usable for drains, reported

    @property
    def serial(self) -> int:
        return self.content.serial

    def age(self, now: datetime) -> timedelta:
        return now - self.content.created_at


def verify(
    raw: bytes,
    trust: TrustStore,
    *,
    now: datetime | None = None,
    max_age: timedelta = timedelta(hours=24),
) -> VerifiedBundle:
    """Check size, form, key and signature, in that order and before any JSON parse; then
    parse the signed content (bounded) and check it. BundleRejected with the reason."""
    if len(raw) > MAX_BUNDLE_BYTES:
        raise BundleRejected(f"not a bundle: {len(raw)} bytes (at most {MAX_BUNDLE_BYTES})")
    envelope = _ENVELOPE.fullmatch(raw)
    if envelope is None:
        raise BundleRejected(
            "not a bundle: expected canonical JSON with content, key_id and signature"
        )
    kid = envelope["kid"].decode()
    signed = envelope["content"]
    try:
        trust.check(kid, signed, envelope["sig"].decode())
    except SignatureRefused as exc:
        raise BundleRejected(str(exc)) from exc
    try:
        # Signed, yet still bounded: a leaked key must not crash every node either.
        doc = loads(signed, what="signed content", max_bytes=MAX_BUNDLE_BYTES)
    except InputRejected as exc:
        raise BundleRejected(str(exc)) from None
    try:
        canonical = canonical_json(doc)
    except ValueError:  # a lone surrogate cannot be UTF-8
        canonical = b""
    if canonical != signed:
        raise BundleRejected("not in canonical form (the file was altered)")
    try:
        # strict=False: JSON has strings where the models hold enums; the content is signed.
        content = BundleContent.model_validate(doc, strict=False)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "-"
        raise BundleRejected(
            f"signed content does not match the bundle format: {where}: {first['msg']} "
            f"({exc.error_count()} error(s))"
        ) from None
    now = now or datetime.now(UTC)
    return VerifiedBundle(content, kid, raw, stale=now - content.created_at > max_age)
