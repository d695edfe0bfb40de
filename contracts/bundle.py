"""The signed contract bundle: canonical JSON, Ed25519, a monotonic serial.

File layout (canonical JSON: sorted keys, no whitespace, UTF-8):
    {"content": {"contracts": [...], "created_at": "...", "format": 1,
                 "notice_policies": [...], "regions": [...], "serial": N},
     "key_id": "<16 hex>", "signature": "<hex Ed25519 over canonical(content)>"}
The same input gives the same bytes (Ed25519 signatures are deterministic). A verifier
accepts only the canonical form, so any changed byte is refused.
`notice_policies` (one per region that has notice-signing keys) is how nodes learn who
may sign their reclaim notices; bundles from before it read as having none.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from nacl.encoding import HexEncoder
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contracts.keys import TrustStore, key_id
from contracts.model import Contract
from contracts.notice import NoticePolicy

FORMAT: Literal[1] = 1


class BundleContent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1] = FORMAT
    serial: int = Field(ge=1)
    created_at: datetime
    regions: list[str]
    contracts: list[Contract]
    notice_policies: list[NoticePolicy] = []

    def notice_policy(self, region: str) -> NoticePolicy | None:
        return next((p for p in self.notice_policies if p.region == region), None)

    def contract(self, name: str) -> Contract | None:
        return next((c for c in self.contracts if c.name == name), None)


class BundleRejected(ValueError):
    """The bundle must not be used; the message says why."""


def canonical_json(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def build(
    contracts: Sequence[Contract],
    *,
    serial: int,
    created_at: datetime,
    key: SigningKey,
    notice_policies: Sequence[NoticePolicy] = (),
) -> bytes:
    content = BundleContent(
        serial=serial,
        created_at=created_at.astimezone(UTC),
        regions=sorted({r for c in contracts for r in c.regions}),
        contracts=sorted(contracts, key=lambda c: c.name),
        notice_policies=sorted(notice_policies, key=lambda p: p.region),
    )
    content_json = content.model_dump(mode="json")
    if not content.notice_policies:
        # Without notice keys the bytes stay those of a bundle from before they existed.
        del content_json["notice_policies"]
    signature = key.sign(canonical_json(content_json)).signature
    return canonical_json(
        {
            "content": content_json,
            "key_id": key_id(key.verify_key),
            "signature": HexEncoder.encode(signature).decode(),
        }
    )


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
    """Check form, key and signature; raise BundleRejected with the reason."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleRejected(f"not a bundle: {exc}") from exc
    if not isinstance(doc, dict) or set(doc) != {"content", "key_id", "signature"}:
        raise BundleRejected("not a bundle: expected content, key_id and signature")
    if canonical_json(doc) != raw:
        raise BundleRejected("not in canonical form (the file was altered)")
    kid = doc["key_id"]
    if not isinstance(kid, str) or kid in trust.revoked:
        raise BundleRejected(f"signed with revoked key {kid}")
    verify_key = trust.keys.get(kid)
    if verify_key is None:
        raise BundleRejected(f"signed with unknown key {kid}")
    try:
        signature = HexEncoder.decode(str(doc["signature"]).encode())
        verify_key.verify(canonical_json(doc["content"]), signature)
    except (BadSignatureError, ValueError, TypeError) as exc:
        raise BundleRejected(f"bad signature for key {kid}") from exc
    try:
        # strict=False: JSON has strings where the models hold enums; the content is signed.
        content = BundleContent.model_validate(doc["content"], strict=False)
    except ValidationError as exc:
        raise BundleRejected(f"signed content does not match the bundle format: {exc}") from exc
    now = now or datetime.now(UTC)
    return VerifiedBundle(content, kid, raw, stale=now - content.created_at > max_age)
