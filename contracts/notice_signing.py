"""Signed reclaim notices: what the notice relay puts on the wire and a node checks.

Wire form (canonical JSON, like the bundle):
    {"key_id": "<16 hex>", "notice": {...ReclaimNotice...}, "signature": "<hex>"}
The signature is Ed25519 over DOMAIN + canonical(notice): the domain tag keeps a notice
signature from ever passing as a bundle signature (or the reverse) should a key be shared.

`check` needs only the node's verified bundle (its region's NoticePolicy) and a clock, so a
node verifies notices with the control plane down; the relays' keys pinned in the node's
install (`pinned`) verify them from first boot, before any bundle. Every refusal has a
typed reason; a refused notice must never cordon or drain.

Per-hall keys: when the region's policy in the bundle is hall-scoped (`NoticePolicy.scopes`),
a key verifies only the notices of the halls its scope lists (`wrong_hall_key` otherwise),
and a key without a scope, a pinned one included, verifies none: once any key names halls,
naming none is never read as "every hall". A scope's `not_after` retires its key on the
node's clock (`retired_key`). A policy without scopes (older bundles) keeps every key
region-wide, as do the pinned keys while no bundle vouches for the region.

Verify before parse: the size is checked first, then the signature over the raw bytes of
the signed body (the wire form is canonical, so those bytes are what the relay signed);
only a verified body is parsed, and with bounds (contracts/bounded.py). Anything else is
parsed (bounded) only to say why it is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from nacl.encoding import HexEncoder
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from contracts.bounded import MAX_NOTICE_BYTES, InputRejected, loads
from contracts.canonical import canonical_json, signed_envelope
from contracts.notice import KeyScope, NoticePolicy, ReclaimNotice
from contracts.records import RecordError


class PolicySource(Protocol):
    """A bundle's content as either side reads it (contracts.bundle.BundleContent, or
    contracts.node_bundle.NodeBundle on a node): only its notice policies are read here."""

    def notice_policy(self, region: str) -> NoticePolicy | None: ...


DOMAIN = b"sco-reclaim-notice-v1\n"
#: Clock skew allowed between relay and node on top of the region's notice lead.
DEFAULT_MARGIN = timedelta(seconds=30)
#: How far ahead an early warning may announce a reclaim. It cordons nothing and drains
#: only opted-in workloads, so a forged-looking far deadline buys an attacker nothing: the
#: bound just keeps a nonsense date (year 9999) out of the node's state.
EARLY_WARNING_HORIZON = timedelta(days=31)
_ENVELOPE = re.compile(
    rb'\{"key_id":"(?P<kid>[0-9a-f]{16})","notice":(?P<body>.*),'
    rb'"signature":"(?P<sig>[0-9a-f]{128})"\}',
    re.DOTALL,
)


class RefusalReason(StrEnum):
    MALFORMED = "malformed"  # not JSON, or not a notice at all
    UNSIGNED = "unsigned"  # a bare notice, no envelope
    NO_POLICY = "no_notice_keys"  # the bundle names no notice keys for this region
    UNKNOWN_KEY = "unknown_key"  # signed by a key the bundle does not list
    BAD_SIGNATURE = "bad_signature"
    OTHER_NODE = "other_node"  # region, hall or node is not this node's
    EXPIRED = "expired"  # the deadline is already past
    DEADLINE_TOO_FAR = "deadline_too_far"  # beyond the region's notice lead + margin
    REVOKED_KEY = "revoked_key"  # signed by a key the node's trust directory revokes
    ISSUED_IN_FUTURE = "issued_in_future"  # issued_at later than now + the clock skew bound
    ISSUED_TOO_LONG_AGO = "issued_too_long_ago"  # older than its stage allows (lead + skew)
    REPLAY = "replay"  # a notice already acted on (decided by the agent's dedupe store)
    WRONG_HALL = "wrong_hall_key"  # signed by a key the bundle scopes to other halls (or none)
    RETIRED_KEY = "retired_key"  # signed by a key past the `not_after` the bundle gives it


@dataclass(frozen=True)
class Refusal:
    reason: RefusalReason
    detail: str
    notice_id: str = ""  # when the payload was readable enough to name one
    key_id: str = ""


@dataclass(frozen=True)
class Accepted:
    notice: ReclaimNotice
    key_id: str


def sign(notice: ReclaimNotice, key: SigningKey) -> bytes:
    return signed_envelope("notice", notice.to_json(), key, domain=DOMAIN)


@dataclass(frozen=True)
class NodeIdentity:
    region: str
    hall: str
    node: str


@dataclass(frozen=True)
class NoticeTrust:
    """Who may sign one region's notices: key id -> public key (hex), the region's lead
    (None: none known), and the halls each key may sign for (`hall_scoped`: the bundle's
    policy names halls, so a key without a scope signs for none)."""

    keys: dict[str, str]
    lead: int | None
    scopes: dict[str, KeyScope]
    hall_scoped: bool

    def halls_of(self, kid: str) -> list[str] | None:
        """The halls `kid` may sign for; None: every hall of the region."""
        if not self.hall_scoped:
            return None
        scope = self.scopes.get(kid)
        return scope.halls if scope is not None else []

    def scope_refusal(self, kid: str, hall: str, now: datetime) -> tuple[RefusalReason, str] | None:
        """Why `kid` may not sign a notice for `hall` at `now`; None: it may."""
        scope = self.scopes.get(kid)
        if scope is not None and scope.not_after is not None and now > scope.not_after:
            return (
                RefusalReason.RETIRED_KEY,
                f"key {kid} retired at {scope.not_after.isoformat()} (bundle not_after)",
            )
        halls = self.halls_of(kid)
        if halls is None or hall in halls:
            return None
        if not halls:
            return (
                RefusalReason.WRONG_HALL,
                f"key {kid} may sign for no hall: the bundle scopes the region's keys to "
                "halls and names none for it",
            )
        return (
            RefusalReason.WRONG_HALL,
            f"key {kid} signs for hall {', '.join(halls)}, not for hall {hall}",
        )


def notice_trust(
    bundle: PolicySource | None, pinned: NoticePolicy | None, region: str
) -> NoticeTrust:
    """The keys that may sign `region`'s notices (the bundle's and the install's pinned
    ones), the region's lead (the bundle's, else the pinned one's) and, when the bundle's
    policy is hall-scoped, the halls each may sign for (a pinned key the bundle does not
    scope then signs for none)."""
    keys: dict[str, str] = {}
    lead: int | None = None
    scopes: dict[str, KeyScope] = {}
    hall_scoped = False
    policy = bundle.notice_policy(region) if bundle is not None else None
    if policy is not None:
        keys.update(policy.keys)
        lead = policy.lead_seconds
        scopes = dict(policy.scopes)
        hall_scoped = policy.hall_scoped
    if pinned is not None and pinned.region == region:
        for kid, public in pinned.keys.items():
            keys.setdefault(kid, public)
        lead = lead if lead is not None else pinned.lead_seconds
    return NoticeTrust(keys, lead, scopes, hall_scoped)


def notice_keys(
    bundle: PolicySource | None, pinned: NoticePolicy | None, region: str
) -> tuple[dict[str, str], int | None]:
    """The keys that may sign some of `region`'s notices and the region's lead (None: no
    lead known); `notice_trust` also says for which halls."""
    trust = notice_trust(bundle, pinned, region)
    return trust.keys, trust.lead


def _label(body_raw: bytes) -> str:
    """The notice id an unverified body claims, for the refusal's journal line only: a
    bounded parse of a refused message, never used to decide anything."""
    try:
        body = loads(body_raw, what="notice", max_bytes=MAX_NOTICE_BYTES)
    except InputRejected:
        return ""
    return str(body.get("notice_id", ""))[:64] if isinstance(body, dict) else ""


def _why_refused(raw: bytes, keys: Mapping[str, str], no_keys: str) -> Refusal:
    """A message that is not a canonical signed envelope: parsed (bounded) only to say why."""
    try:
        doc: Any = loads(raw, what="notice", max_bytes=MAX_NOTICE_BYTES)
    except InputRejected as exc:
        return Refusal(RefusalReason.MALFORMED, str(exc))
    if not isinstance(doc, dict):
        return Refusal(RefusalReason.MALFORMED, "not a JSON object")
    if set(doc) != {"key_id", "notice", "signature"}:
        named = str(doc.get("notice_id", ""))[:64] if "signature" not in doc else ""
        return Refusal(RefusalReason.UNSIGNED, "no signed envelope", notice_id=named)
    body, kid, sig = doc["notice"], doc["key_id"], doc["signature"]
    if not isinstance(body, dict) or not isinstance(kid, str) or not isinstance(sig, str):
        return Refusal(RefusalReason.MALFORMED, "envelope fields of the wrong type")
    kid = kid[:64]
    if not keys:
        return Refusal(RefusalReason.NO_POLICY, no_keys, key_id=kid)
    if kid not in keys:
        return Refusal(RefusalReason.UNKNOWN_KEY, f"key {kid} is not trusted", key_id=kid)
    return Refusal(
        RefusalReason.BAD_SIGNATURE,
        f"bad signature for key {kid}: the envelope is not in canonical form",
        key_id=kid,
    )


def check(
    raw: bytes,
    bundle: PolicySource | None,
    me: NodeIdentity,
    now: datetime,
    *,
    margin: timedelta = DEFAULT_MARGIN,
    pinned: NoticePolicy | None = None,
    revoked: frozenset[str] = frozenset(),
) -> Accepted | Refusal:
    """Accept the notice only if a key of this region's bundle policy (or one pinned in
    the node's install) signed it, that key may sign for the notice's hall and is not
    retired (`NoticeTrust.scope_refusal`), it is for this node, its deadline lies between
    now and now + lead + margin (an early warning's: between now and now +
    EARLY_WARNING_HORIZON) and its issued_at is neither later than now + margin nor older
    than its stage allows.
    `margin` is the clock skew the node allows between itself and the relay; `now` is the
    node's clock corrected by its measured offset. `bundle`: None when the node holds none
    it trusts for notices (none yet, or one past its max age)."""
    if len(raw) > MAX_NOTICE_BYTES:
        return Refusal(
            RefusalReason.MALFORMED, f"notice: {len(raw)} bytes (at most {MAX_NOTICE_BYTES})"
        )
    trust = notice_trust(bundle, pinned, me.region)
    keys, lead = trust.keys, trust.lead
    no_keys = (
        "no notice keys ("
        + (
            "no valid contract bundle and none pinned in the install"
            if bundle is None
            else f"none for region {me.region} in the bundle or the install"
        )
        + ")"
    )
    envelope = _ENVELOPE.fullmatch(raw)
    if envelope is None:
        return _why_refused(raw, keys, no_keys)
    kid = envelope["kid"].decode()
    body_raw = envelope["body"]
    if kid in revoked:
        return Refusal(RefusalReason.REVOKED_KEY, f"key {kid} is revoked", _label(body_raw), kid)
    if not keys or lead is None:
        return Refusal(RefusalReason.NO_POLICY, no_keys, _label(body_raw), kid)
    public = keys.get(kid)
    if public is None:
        return Refusal(
            RefusalReason.UNKNOWN_KEY, f"key {kid} is not in the bundle", _label(body_raw), kid
        )
    try:
        VerifyKey(public.encode(), encoder=HexEncoder).verify(
            DOMAIN + body_raw, bytes.fromhex(envelope["sig"].decode())
        )
    except (BadSignatureError, ValueError, TypeError) as exc:
        return Refusal(
            RefusalReason.BAD_SIGNATURE,
            f"bad signature for key {kid}: {exc}",
            _label(body_raw),
            kid,
        )
    try:
        body = loads(body_raw, what="signed notice", max_bytes=MAX_NOTICE_BYTES)
        canonical = canonical_json(body) == body_raw
        notice = ReclaimNotice.from_json(body, "")
    except InputRejected as exc:
        return Refusal(RefusalReason.MALFORMED, str(exc), key_id=kid)
    except RecordError as exc:
        return Refusal(RefusalReason.MALFORMED, f"signed body is not a notice: {exc}", key_id=kid)
    except ValueError as exc:  # a lone surrogate cannot be re-encoded
        return Refusal(RefusalReason.MALFORMED, f"signed body unusable: {exc}", key_id=kid)
    if not canonical:
        return Refusal(
            RefusalReason.MALFORMED, "signed body is not in canonical form", notice.notice_id, kid
        )
    if notice.deadline.tzinfo is None or notice.issued_at.tzinfo is None:
        return Refusal(
            RefusalReason.MALFORMED, "deadline and issued_at need a timezone", notice.notice_id, kid
        )
    # The hall the notice names: a genuine notice of another hall stays `other_node`.
    scoped_out = trust.scope_refusal(kid, notice.hall, now)
    if scoped_out is not None:
        return Refusal(scoped_out[0], scoped_out[1], notice.notice_id, kid)
    try:
        return _judge(notice, kid, me, now, margin, lead)
    except (OverflowError, ValueError) as exc:  # dates at the ends of the calendar
        return Refusal(RefusalReason.MALFORMED, f"times out of range: {exc}", notice.notice_id, kid)


def _judge(
    notice: ReclaimNotice,
    kid: str,
    me: NodeIdentity,
    now: datetime,
    margin: timedelta,
    lead_seconds: int,
) -> Accepted | Refusal:
    """Who the notice is for, and its times against the node's (corrected) clock."""
    if (notice.region, notice.hall, notice.node) != (me.region, me.hall, me.node):
        return Refusal(
            RefusalReason.OTHER_NODE,
            f"for {notice.region}/{notice.hall}/{notice.node}, "
            f"this is {me.region}/{me.hall}/{me.node}",
            notice.notice_id,
            kid,
        )
    if notice.deadline <= now:
        return Refusal(
            RefusalReason.EXPIRED, f"deadline {notice.deadline} passed", notice.notice_id, kid
        )
    lead = timedelta(seconds=lead_seconds)
    if notice.early:
        if notice.deadline > now + EARLY_WARNING_HORIZON:
            return Refusal(
                RefusalReason.DEADLINE_TOO_FAR,
                f"early warning for {notice.deadline}: beyond {EARLY_WARNING_HORIZON.days} days",
                notice.notice_id,
                kid,
            )
        oldest = now - EARLY_WARNING_HORIZON - margin
    else:
        latest = now + lead + margin
        if notice.deadline > latest:
            return Refusal(
                RefusalReason.DEADLINE_TOO_FAR,
                f"deadline {notice.deadline} is beyond the region's lead "
                f"{lead_seconds} s + {margin.total_seconds():.0f} s",
                notice.notice_id,
                kid,
            )
        # A relay republishes a hard notice until its deadline, with the first issued_at.
        oldest = now - lead - margin
    if notice.issued_at > now + margin:
        return Refusal(
            RefusalReason.ISSUED_IN_FUTURE,
            f"issued_at {notice.issued_at} is later than now + {margin.total_seconds():.0f} s "
            "(clock skew bound)",
            notice.notice_id,
            kid,
        )
    if notice.issued_at < oldest:
        return Refusal(
            RefusalReason.ISSUED_TOO_LONG_AGO,
            f"issued_at {notice.issued_at} is older than {oldest}",
            notice.notice_id,
            kid,
        )
    return Accepted(notice, kid)
