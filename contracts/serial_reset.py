"""An operator-signed serial reset: the way out of a poisoned bundle serial.

A bundle signed with a leaked key can carry a serial far above the real ones (within the
cache's bounded step, or on a node that had none); every later genuine bundle is then a
"rollback". Revoking the key drops its serials from the rollback record
(contracts/cache.py); a reset does the rest: signed by a trusted (not revoked) bundle key,
for one region, it lowers the node's rollback floor to `to_serial`, so the next genuine
bundle (serial >= to_serial) is accepted. `sco contracts reset-serial` makes one and
publishes it beside the bundle (`serial-reset.json` in the region's bucket); nodes apply
it at their next refresh.

Wire form (canonical JSON): {"key_id": "<16 hex>", "reset": {...}, "signature": "<hex>"},
the signature over DOMAIN + canonical(reset), so it never passes as a bundle's or a
notice's. A reset is honoured once (a later issued_at than the last one applied) and only
while fresh (RESET_MAX_AGE): an old reset replayed cannot roll a node back.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from nacl.signing import SigningKey
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from contracts.bounded import InputRejected, loads
from contracts.bundle import MAX_SERIAL, BundleRejected, signed_envelope
from contracts.keys import SignatureRefused, TrustStore

DOMAIN = b"sco-serial-reset-v1\n"
OBJECT_NAME = "serial-reset.json"
RESET_MAX_AGE = timedelta(days=7)
#: A reset issued later than now + this (the issuer's clock ahead) is refused.
RESET_FUTURE_SKEW = timedelta(minutes=5)
MAX_RESET_BYTES = 4096
_ENVELOPE = re.compile(
    rb'\{"key_id":"(?P<kid>[0-9a-f]{16})","reset":(?P<body>.*),'
    rb'"signature":"(?P<sig>[0-9a-f]{128})"\}',
    re.DOTALL,
)


class SerialReset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str = Field(min_length=1, max_length=64)
    to_serial: int = Field(ge=1, le=MAX_SERIAL)
    issued_at: AwareDatetime
    reason: str = Field(default="", max_length=200)
    by: str = Field(default="", max_length=100)


def sign(reset: SerialReset, key: SigningKey) -> bytes:
    return signed_envelope("reset", reset.model_dump(mode="json"), key, domain=DOMAIN)


def verify(
    raw: bytes, trust: TrustStore, *, region: str, now: datetime | None = None
) -> SerialReset:
    """Size, form, key and signature before any parse; then region and freshness.
    BundleRejected("serial reset: ...") with the reason."""
    if len(raw) > MAX_RESET_BYTES:
        raise BundleRejected(f"serial reset: {len(raw)} bytes (at most {MAX_RESET_BYTES})")
    envelope = _ENVELOPE.fullmatch(raw)
    if envelope is None:
        raise BundleRejected("serial reset: not canonical JSON with key_id, reset and signature")
    kid = envelope["kid"].decode()
    try:
        trust.check(kid, DOMAIN + envelope["body"], envelope["sig"].decode())
    except SignatureRefused as exc:
        raise BundleRejected(f"serial reset: {exc}") from exc
    try:
        reset = SerialReset.model_validate(
            loads(envelope["body"], what="serial reset", max_bytes=MAX_RESET_BYTES)
        )
    except InputRejected as exc:
        raise BundleRejected(str(exc)) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "-"
        raise BundleRejected(f"serial reset: {where}: {first['msg']}") from None
    if reset.region != region:
        raise BundleRejected(f"serial reset: for region {reset.region}, this is {region}")
    now = now or datetime.now(UTC)
    if reset.issued_at > now + RESET_FUTURE_SKEW:
        raise BundleRejected(f"serial reset: issued_at {reset.issued_at} is in the future")
    if now - reset.issued_at > RESET_MAX_AGE:
        raise BundleRejected(
            f"serial reset: issued {reset.issued_at}, older than {RESET_MAX_AGE.days} days"
        )
    return reset
