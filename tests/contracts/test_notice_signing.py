"""Signed reclaim notices: canonical bytes, signature, and every typed refusal."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nacl.encoding import HexEncoder
from nacl.signing import SigningKey

from contracts import bundle, keys
from contracts.bundle import BundleContent, canonical_json
from contracts.compiler import compile_and_sign
from contracts.notice import NoticePolicy, ReclaimNotice
from contracts.notice_signing import (
    Accepted,
    NodeIdentity,
    Refusal,
    RefusalReason,
    check,
    sign,
)
from contracts.source import read_contracts
from tests.support.paths import EXAMPLES, REGIONS_DIR

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
ME = NodeIdentity("r1", "D", "node-1")
RELAY = SigningKey(b"\x01" * 32)
STRANGER = SigningKey(b"\x02" * 32)


def content(*signers: SigningKey, lead: int = 120) -> BundleContent:
    sources, findings = read_contracts(EXAMPLES)
    assert not findings
    policy = NoticePolicy(
        region="r1",
        lead_seconds=lead,
        keys={keys.key_id(k.verify_key): k.verify_key.encode(HexEncoder).decode() for k in signers},
    )
    raw = bundle.build(
        [s.contract for s in sources],
        serial=1,
        created_at=NOW,
        key=SigningKey(b"\x03" * 32),
        notice_policies=[policy],
    )
    return BundleContent.model_validate(json.loads(raw)["content"], strict=False)


def notice(*, node: str = "node-1", deadline_s: float = 120, hall: str = "D") -> ReclaimNotice:
    return ReclaimNotice(
        notice_id=ReclaimNotice.stable_id("r1", node, NOW),
        region="r1",
        hall=hall,
        node=node,
        pool_id="r1.D.cpu.l",
        issued_at=NOW,
        deadline=NOW + timedelta(seconds=deadline_s),
    )


def refused(result: Accepted | Refusal) -> RefusalReason:
    assert isinstance(result, Refusal), result
    return result.reason


def test_a_relay_signed_notice_for_this_node_is_accepted() -> None:
    n = notice()
    raw = sign(n, RELAY)
    assert raw == sign(n, RELAY)  # canonical and deterministic: the same notice, same bytes
    assert raw == canonical_json(json.loads(raw))
    result = check(raw, content(RELAY), ME, NOW)
    assert isinstance(result, Accepted)
    assert result.notice == n and result.key_id == keys.key_id(RELAY.verify_key)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"not json", RefusalReason.MALFORMED),
        (b"[1, 2]", RefusalReason.MALFORMED),
        (json.dumps(notice().to_json()).encode(), RefusalReason.UNSIGNED),
        (sign(notice(), STRANGER), RefusalReason.UNKNOWN_KEY),
        (sign(notice(node="node-2"), RELAY), RefusalReason.OTHER_NODE),
        (sign(notice(hall="A"), RELAY), RefusalReason.OTHER_NODE),
        (sign(notice(deadline_s=-1), RELAY), RefusalReason.EXPIRED),
        (sign(notice(deadline_s=120 + 31), RELAY), RefusalReason.DEADLINE_TOO_FAR),
        (sign(notice(deadline_s=86400 * 365), RELAY), RefusalReason.DEADLINE_TOO_FAR),
    ],
)
def test_every_bad_notice_is_refused_with_its_reason(raw: bytes, reason: RefusalReason) -> None:
    assert refused(check(raw, content(RELAY), ME, NOW)) is reason


def test_a_deadline_within_lead_and_margin_is_accepted() -> None:
    assert isinstance(check(sign(notice(deadline_s=149), RELAY), content(RELAY), ME, NOW), Accepted)


def test_a_changed_byte_breaks_the_signature() -> None:
    doc = json.loads(sign(notice(), RELAY))
    doc["notice"]["deadline"] = (NOW + timedelta(seconds=60)).isoformat()  # an earlier kill
    assert refused(check(canonical_json(doc), content(RELAY), ME, NOW)) is (
        RefusalReason.BAD_SIGNATURE
    )
    doc = json.loads(sign(notice(), RELAY))
    doc["signature"] = "zz"
    assert refused(check(canonical_json(doc), content(RELAY), ME, NOW)) is (
        RefusalReason.BAD_SIGNATURE
    )


def test_a_signature_without_the_notice_domain_is_refused() -> None:
    """A key's signature over the bare body (as a bundle is signed) is not a notice's."""
    body = notice().to_json()
    forged = canonical_json(
        {
            "key_id": keys.key_id(RELAY.verify_key),
            "notice": body,
            "signature": HexEncoder.encode(RELAY.sign(canonical_json(body)).signature).decode(),
        }
    )
    assert refused(check(forged, content(RELAY), ME, NOW)) is RefusalReason.BAD_SIGNATURE


def test_without_a_bundle_or_its_region_policy_nothing_is_accepted() -> None:
    raw = sign(notice(), RELAY)
    assert refused(check(raw, None, ME, NOW)) is RefusalReason.NO_POLICY
    other = NodeIdentity("r2", "D", "node-1")
    assert refused(check(raw, content(RELAY), other, NOW)) is RefusalReason.NO_POLICY


def test_compile_puts_each_regions_notice_keys_and_lead_in_the_bundle(tmp_path: Path) -> None:
    notice_keys = tmp_path / "notice-keys"
    kid, _, _ = keys.generate(notice_keys / "r1")
    revoked, _, _ = keys.generate(notice_keys / "r1")
    (notice_keys / "r1" / "revoked.txt").write_text(f"{revoked}  # relay host lost\n")
    _, signer, _ = keys.generate(tmp_path / "signer")
    trust = tmp_path / "signer"
    out = tmp_path / "bundle.json"
    result, serial = compile_and_sign(
        EXAMPLES,
        REGIONS_DIR,
        keys.load_signing_key(signer),
        out,
        serial=None,
        created_at=NOW,
        notice_keys_dir=notice_keys,
    )
    assert serial == 1, result.findings
    verified = bundle.verify(out.read_bytes(), keys.TrustStore.load(trust), now=NOW)
    policy = verified.content.notice_policy("r1")
    assert policy is not None and set(policy.keys) == {kid}
    assert policy.lead_seconds > 0 and verified.content.notice_policy("r2") is None


def test_a_notice_key_dir_for_an_unknown_region_writes_nothing(tmp_path: Path) -> None:
    keys.generate(tmp_path / "notice-keys" / "r9")
    _, signer, _ = keys.generate(tmp_path / "signer")
    out = tmp_path / "bundle.json"
    result, serial = compile_and_sign(
        EXAMPLES,
        REGIONS_DIR,
        keys.load_signing_key(signer),
        out,
        serial=None,
        created_at=NOW,
        notice_keys_dir=tmp_path / "notice-keys",
    )
    assert serial is None and not out.exists()
    assert "no such region" in str(result.findings[0])


def test_a_bundle_without_notice_keys_keeps_its_old_bytes() -> None:
    sources, _ = read_contracts(EXAMPLES)
    raw = bundle.build([s.contract for s in sources], serial=1, created_at=NOW, key=RELAY)
    assert "notice_policies" not in json.loads(raw)["content"]
