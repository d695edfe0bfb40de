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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from nacl.signing import SigningKey

from contracts.bounded import InputRejected, loads
from contracts.canonical import signed_envelope
from contracts.keys import SignatureRefused, TrustStore
from contracts.records import RecordError, aware, json_datetime, read
from contracts.signed_bundle import MAX_SERIAL, BundleRejected

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


@dataclass(frozen=True)
class SerialReset:
    region: str
    to_serial: int
    issued_at: datetime
    reason: str = ""
    by: str = ""

    def __post_init__(self) -> None:
        for name, low, high in (("region", 1, 64), ("reason", 0, 200), ("by", 0, 100)):
            value = getattr(self, name)
            if not isinstance(value, str) or not low <= len(value) <= high:
                raise RecordError(name, f"expected a string of {low} to {high} characters")
        serial = self.to_serial
        if isinstance(serial, bool) or not isinstance(serial, int) or not 1 <= serial <= MAX_SERIAL:
            raise RecordError("to_serial", f"expected an integer from 1 to {MAX_SERIAL}")
        if not isinstance(self.issued_at, datetime):
            raise RecordError("issued_at", "expected a date-time")
        aware(self.issued_at, "issued_at")

    @classmethod
    def from_json(cls, doc: object) -> SerialReset:
        return read(
            doc,
            "",
            lambda r: cls(
                region=r.text("region"),
                to_serial=r.integer("to_serial"),
                issued_at=r.when("issued_at"),
                reason=r.text("reason", ""),
                by=r.text("by", ""),
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "to_serial": self.to_serial,
            "issued_at": json_datetime(self.issued_at),
            "reason": self.reason,
            "by": self.by,
        }


def sign(reset: SerialReset, key: SigningKey) -> bytes:
    return signed_envelope("reset", reset.to_json(), key, domain=DOMAIN)


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
        reset = SerialReset.from_json(
            loads(envelope["body"], what="serial reset", max_bytes=MAX_RESET_BYTES)
        )
    except InputRejected as exc:
        raise BundleRejected(str(exc)) from None
    except RecordError as exc:
        raise BundleRejected(f"serial reset: {exc}") from None
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
