"""Opening a signed bundle: size, canonical envelope, key and signature, then a bounded
parse of the signed content. What the content must be is the reader's: the control plane
validates it as `contracts.bundle.BundleContent` (pydantic, every contract rule), a node
reads the terms it acts on as `contracts.node_bundle.NodeBundle` (no pydantic, decision
0041). Both go through `verify_as`, so the checks before any parse are written once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, Literal, Protocol, TypeVar

from contracts.bounded import MAX_BUNDLE_BYTES, InputRejected, loads
from contracts.canonical import canonical_json
from contracts.keys import SignatureRefused, TrustStore

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


class BundleRejected(ValueError):
    """The bundle must not be used; the message says why."""


class Content(Protocol):
    """What every reading of a bundle's content has."""

    @property
    def serial(self) -> int: ...

    @property
    def created_at(self) -> datetime: ...


C = TypeVar("C", bound=Content)
#: Signed content (a JSON object) -> its reading; BundleRejected when it is not one.
ContentParser = Callable[[dict[str, Any]], C]


@dataclass(frozen=True)
class VerifiedBundle(Generic[C]):
    content: C
    key_id: str
    raw: bytes
    stale: bool  # older than the verifier's max age: still usable for drains, reported

    @property
    def serial(self) -> int:
        return self.content.serial

    def age(self, now: datetime) -> timedelta:
        return now - self.content.created_at


def open_signed(raw: bytes, trust: TrustStore) -> tuple[str, dict[str, Any]]:
    """The key id and the signed content of `raw`: size, form, key and signature checked,
    in that order and before any JSON parse; then the content parsed (bounded) and found
    in canonical form. BundleRejected with the reason."""
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
    if not isinstance(doc, dict):
        raise BundleRejected("signed content does not match the bundle format: not an object")
    return kid, doc


def verify_as(
    raw: bytes,
    trust: TrustStore,
    parse: ContentParser[C],
    *,
    now: datetime | None = None,
    max_age: timedelta = timedelta(hours=24),
) -> VerifiedBundle[C]:
    """`raw` opened (`open_signed`) and its content read by `parse`."""
    kid, doc = open_signed(raw, trust)
    content = parse(doc)
    now = now or datetime.now(UTC)
    return VerifiedBundle(content, kid, raw, stale=now - content.created_at > max_age)
