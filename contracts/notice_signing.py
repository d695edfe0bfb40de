"""Signed reclaim notices: what the notice relay puts on the wire and a node checks.

Wire form (canonical JSON, like the bundle):
    {"key_id": "<16 hex>", "notice": {...ReclaimNotice...}, "signature": "<hex>"}
The signature is Ed25519 over DOMAIN + canonical(notice): the domain tag keeps a notice
signature from ever passing as a bundle signature (or the reverse) should a key be shared.

`check` needs only the node's verified bundle (its region's NoticePolicy) and a clock, so a
node verifies notices with the control plane down. Every refusal has a typed reason; a
refused notice must never cordon or drain.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from nacl.encoding import HexEncoder
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey
from pydantic import ValidationError

from contracts.bundle import BundleContent, canonical_json
from contracts.keys import key_id
from contracts.notice import ReclaimNotice

DOMAIN = b"sco-reclaim-notice-v1\n"
#: Clock skew allowed between relay and node on top of the region's notice lead.
DEFAULT_MARGIN = timedelta(seconds=30)
#: How far ahead an early warning may announce a reclaim. It cordons nothing and drains
#: only opted-in workloads, so a forged-looking far deadline buys an attacker nothing: the
#: bound just keeps a nonsense date (year 9999) out of the node's state.
EARLY_WARNING_HORIZON = timedelta(days=31)


class RefusalReason(StrEnum):
    MALFORMED = "malformed"  # not JSON, or not a notice at all
    UNSIGNED = "unsigned"  # a bare notice, no envelope
    NO_POLICY = "no_notice_keys"  # the bundle names no notice keys for this region
    UNKNOWN_KEY = "unknown_key"  # signed by a key the bundle does not list
    BAD_SIGNATURE = "bad_signature"
    OTHER_NODE = "other_node"  # region, hall or node is not this node's
    EXPIRED = "expired"  # the deadline is already past
    DEADLINE_TOO_FAR = "deadline_too_far"  # beyond the region's notice lead + margin
    REPLAY = "replay"  # a notice already acted on (decided by the agent's dedupe store)


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
    body = notice.model_dump(mode="json")
    signature = key.sign(DOMAIN + canonical_json(body)).signature
    return canonical_json(
        {
            "key_id": key_id(key.verify_key),
            "notice": body,
            "signature": HexEncoder.encode(signature).decode(),
        }
    )


@dataclass(frozen=True)
class NodeIdentity:
    region: str
    hall: str
    node: str


def check(
    raw: bytes,
    bundle: BundleContent | None,
    me: NodeIdentity,
    now: datetime,
    *,
    margin: timedelta = DEFAULT_MARGIN,
) -> Accepted | Refusal:
    """Accept the notice only if a key of this region's bundle policy signed it, it is for
    this node, and its deadline lies between now and now + lead + margin (an early
    warning's: between now and now + EARLY_WARNING_HORIZON)."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Refusal(RefusalReason.MALFORMED, f"not JSON: {exc}")
    if not isinstance(doc, dict):
        return Refusal(RefusalReason.MALFORMED, "not a JSON object")
    if set(doc) != {"key_id", "notice", "signature"}:
        named = str(doc.get("notice_id", "")) if "signature" not in doc else ""
        return Refusal(RefusalReason.UNSIGNED, "no signed envelope", notice_id=named)
    body, kid, sig = doc["notice"], doc["key_id"], doc["signature"]
    named = str(body.get("notice_id", "")) if isinstance(body, dict) else ""
    if not isinstance(body, dict) or not isinstance(kid, str) or not isinstance(sig, str):
        return Refusal(RefusalReason.MALFORMED, "envelope fields of the wrong type")
    policy = bundle.notice_policy(me.region) if bundle is not None else None
    if policy is None or not policy.keys:
        why = "no valid contract bundle" if bundle is None else f"none for region {me.region}"
        return Refusal(RefusalReason.NO_POLICY, f"no notice keys ({why})", named, kid)
    public = policy.keys.get(kid)
    if public is None:
        return Refusal(RefusalReason.UNKNOWN_KEY, f"key {kid} is not in the bundle", named, kid)
    try:
        VerifyKey(public.encode(), encoder=HexEncoder).verify(
            DOMAIN + canonical_json(body), HexEncoder.decode(sig.encode())
        )
    except (BadSignatureError, ValueError, TypeError) as exc:
        return Refusal(
            RefusalReason.BAD_SIGNATURE, f"bad signature for key {kid}: {exc}", named, kid
        )
    try:
        notice = ReclaimNotice.model_validate(body)
    except ValidationError as exc:
        return Refusal(RefusalReason.MALFORMED, f"signed body is not a notice: {exc}", named, kid)
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
    if notice.early:
        if notice.deadline > now + EARLY_WARNING_HORIZON:
            return Refusal(
                RefusalReason.DEADLINE_TOO_FAR,
                f"early warning for {notice.deadline}: beyond {EARLY_WARNING_HORIZON.days} days",
                notice.notice_id,
                kid,
            )
        return Accepted(notice, kid)
    latest = now + timedelta(seconds=policy.lead_seconds) + margin
    if notice.deadline > latest:
        return Refusal(
            RefusalReason.DEADLINE_TOO_FAR,
            f"deadline {notice.deadline} is beyond the region's lead "
            f"{policy.lead_seconds} s + {margin.total_seconds():.0f} s",
            notice.notice_id,
            kid,
        )
    return Accepted(notice, kid)
