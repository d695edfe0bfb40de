"""Per-hall notice keys: the bundle says which key signs for which hall (scopes.yaml ->
NoticePolicy.scopes), and a node refuses a notice signed by another hall's key, an
unknown key, or a retired one. Hostile cases first; all pure, no I/O but tmp files."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nacl.encoding import HexEncoder
from nacl.signing import SigningKey

from contracts import bundle, keys
from contracts.bundle import BundleContent
from contracts.compiler import compile_and_sign
from contracts.findings import Severity
from contracts.notice import KeyScope, NoticePolicy, ReclaimNotice
from contracts.notice_scopes import SCOPES_FILE, add_key, retire_key
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
HALL_A = SigningKey(b"\x0a" * 32)
HALL_B = SigningKey(b"\x0b" * 32)
HALL_A_NEXT = SigningKey(b"\x1a" * 32)
STRANGER = SigningKey(b"\x02" * 32)
IN_A = NodeIdentity("r1", "A", "node-a1")
IN_B = NodeIdentity("r1", "B", "node-b1")


def kid(k: SigningKey) -> str:
    return keys.key_id(k.verify_key)


def policy(scopes: dict[SigningKey, KeyScope], *unscoped: SigningKey) -> NoticePolicy:
    signers = [*scopes, *unscoped]
    return NoticePolicy(
        region="r1",
        lead_seconds=120,
        keys={kid(k): k.verify_key.encode(HexEncoder).decode() for k in signers},
        scopes={kid(k): s for k, s in scopes.items()},
    )


def content(p: NoticePolicy) -> BundleContent:
    """A signed bundle's content, through the bytes (what a node parses)."""
    sources, _ = read_contracts(EXAMPLES)
    raw = bundle.build(
        [s.contract for s in sources],
        serial=1,
        created_at=NOW,
        key=SigningKey(b"\x03" * 32),
        notice_policies=[p],
    )
    return BundleContent.model_validate(json.loads(raw)["content"], strict=False)


def notice(me: NodeIdentity, tag: str = "") -> ReclaimNotice:
    return ReclaimNotice(
        notice_id=ReclaimNotice.stable_id("r1", me.node + tag, NOW),
        region=me.region,
        hall=me.hall,
        node=me.node,
        pool_id=f"r1.{me.hall}.cpu.l",
        issued_at=NOW,
        deadline=NOW + timedelta(seconds=60),
    )


def reason(result: Accepted | Refusal) -> RefusalReason:
    assert isinstance(result, Refusal), result
    return result.reason


PER_HALL = policy({HALL_A: KeyScope(halls=["A"]), HALL_B: KeyScope(halls=["B"])})


def test_a_notice_for_hall_a_signed_by_hall_bs_key_is_refused() -> None:
    result = check(sign(notice(IN_A), HALL_B), content(PER_HALL), IN_A, NOW)
    assert reason(result) is RefusalReason.WRONG_HALL
    assert isinstance(result, Refusal) and result.key_id == kid(HALL_B)
    assert f"key {kid(HALL_B)} signs for hall B, not for hall A" in result.detail
    assert "\n" not in result.detail


def test_each_halls_key_signs_its_own_halls_notices() -> None:
    bundle_content = content(PER_HALL)
    for me, key in ((IN_A, HALL_A), (IN_B, HALL_B)):
        result = check(sign(notice(me), key), bundle_content, me, NOW)
        assert isinstance(result, Accepted) and result.key_id == kid(key)


def test_an_unknown_key_is_refused_even_when_it_names_this_hall() -> None:
    result = check(sign(notice(IN_A), STRANGER), content(PER_HALL), IN_A, NOW)
    assert reason(result) is RefusalReason.UNKNOWN_KEY


def test_a_genuine_notice_of_another_hall_stays_other_node() -> None:
    # Hall B's key signing hall B's notice is fine; it is just not for a node of hall A.
    result = check(sign(notice(IN_B), HALL_B), content(PER_HALL), IN_A, NOW)
    assert reason(result) is RefusalReason.OTHER_NODE


def test_once_any_key_names_halls_a_key_naming_none_signs_for_no_hall() -> None:
    mixed = policy({HALL_A: KeyScope(halls=["A"])}, STRANGER)
    result = check(sign(notice(IN_A), STRANGER), content(mixed), IN_A, NOW)
    assert reason(result) is RefusalReason.WRONG_HALL
    assert isinstance(result, Refusal) and "may sign for no hall" in result.detail


def test_a_pinned_key_the_hall_scoped_bundle_does_not_scope_is_refused() -> None:
    pinned = policy({}, STRANGER)
    result = check(sign(notice(IN_A), STRANGER), content(PER_HALL), IN_A, NOW, pinned=pinned)
    assert reason(result) is RefusalReason.WRONG_HALL
    # Without a bundle the install's pinned keys verify region-wide, as before.
    assert isinstance(check(sign(notice(IN_A), STRANGER), None, IN_A, NOW, pinned=pinned), Accepted)


def test_a_bundle_without_scopes_keeps_every_key_region_wide() -> None:
    old = policy({}, HALL_A, HALL_B)
    assert not old.hall_scoped
    assert isinstance(check(sign(notice(IN_A), HALL_B), content(old), IN_A, NOW), Accepted)


def test_a_retired_key_verifies_until_its_not_after_and_never_after() -> None:
    retiring = policy(
        {
            HALL_A: KeyScope(halls=["A"], not_after=NOW + timedelta(seconds=150)),
            HALL_A_NEXT: KeyScope(halls=["A"]),
        }
    )
    c = content(retiring)
    old_sig = sign(notice(IN_A), HALL_A)
    assert isinstance(check(old_sig, c, IN_A, NOW), Accepted)  # within the lead: still good
    later = NOW + timedelta(seconds=151)
    late_notice = notice(IN_A).replace(
        **{"issued_at": later, "deadline": later + timedelta(seconds=60)}
    )
    result = check(sign(late_notice, HALL_A), c, IN_A, later)
    assert reason(result) is RefusalReason.RETIRED_KEY
    assert isinstance(result, Refusal) and "retired at" in result.detail
    # The new key of the same hall goes on verifying.
    assert isinstance(check(sign(late_notice, HALL_A_NEXT), c, IN_A, later), Accepted)


def test_scopes_leave_the_bytes_of_a_bundle_without_them_unchanged() -> None:
    plain = policy({}, HALL_A)
    assert "scopes" not in plain.to_json()
    scoped = PER_HALL.to_json()
    assert scoped["scopes"][kid(HALL_A)] == {"halls": ["A"]}  # no not_after: not in the bytes


def test_a_policy_scoping_a_key_it_does_not_list_is_malformed() -> None:
    with pytest.raises(ValueError, match="scopes of keys the policy does not list"):
        NoticePolicy(
            region="r1", lead_seconds=120, keys={}, scopes={kid(HALL_A): KeyScope(halls=["A"])}
        )


# --- compile: scopes.yaml -> the bundle ---------------------------------------------------


def compile_with(
    tmp: Path, *, created_at: datetime = NOW
) -> tuple[list[str], BundleContent | None]:
    """Compile the examples with `tmp/notice-keys` (r2 and r3 get one region-wide key each:
    regions without hall scopes beside one with them); the findings and the content."""
    if not (tmp / "signer").exists():
        keys.generate(tmp / "signer")
        for other in ("r2", "r3"):
            keys.generate(tmp / "notice-keys" / other)
    signer = next((tmp / "signer").glob("*.key"))
    out = tmp / "bundle.json"
    result, serial = compile_and_sign(
        EXAMPLES,
        REGIONS_DIR,
        keys.load_signing_key(signer),
        out,
        serial=None,
        created_at=created_at,
        notice_keys_dir=tmp / "notice-keys",
        require_notice_keys=True,
    )
    lines = [str(f) for f in result.findings]
    if serial is None:
        return lines, None
    verified = bundle.verify(out.read_bytes(), keys.TrustStore.load(tmp / "signer"), now=created_at)
    return lines, verified.content


def hall_key(tmp: Path, hall: str) -> str:
    region_dir = tmp / "notice-keys" / "r1"
    key_id, _, _ = keys.generate(region_dir)
    add_key(region_dir, key_id, [hall])
    return key_id


def test_compile_carries_each_keys_halls_into_the_bundle(tmp_path: Path) -> None:
    ids = {hall: hall_key(tmp_path, hall) for hall in "ABCD"}
    lines, c = compile_with(tmp_path)
    assert c is not None, lines
    p = c.notice_policy("r1")
    assert p is not None and p.hall_scoped
    assert {h: p.scopes[k].halls for h, k in ids.items()} == {h: [h] for h in "ABCD"}
    region_wide = c.notice_policy("r2")  # a region without scopes.yaml: as before
    assert region_wide is not None and not region_wide.hall_scoped


def test_compile_refuses_a_hall_scoped_region_with_a_hall_no_key_signs_for(
    tmp_path: Path,
) -> None:
    for hall in "ABC":
        hall_key(tmp_path, hall)
    lines, c = compile_with(tmp_path)
    assert c is None
    assert any("r1/D:" in line and "none signs for hall D" in line for line in lines), lines


@pytest.mark.parametrize(
    ("entry", "field", "why"),
    [
        ("{halls: [Z]}", "{kid}.halls", "hall Z not in region r1"),
        ("{halls: []}", "{kid}.halls", "at least 1 item"),
        ("{halls: A}", "{kid}.halls", "expected an array"),
        ("{halls: [A, A]}", "{kid}.halls", "listed twice"),
        ("{halls: [A], not_after: 2026-05-02T00:00:00}", "{kid}.not_after", "timezone"),
        ("{halls: [A], hals: [B]}", "{kid}.hals", "extra field not permitted"),
        ("[A]", "{kid}", "expected an object"),
    ],
)
def test_a_malformed_scope_is_one_line_naming_file_and_field(
    tmp_path: Path, entry: str, field: str, why: str
) -> None:
    region_dir = tmp_path / "notice-keys" / "r1"
    key_id, _, _ = keys.generate(region_dir)
    (region_dir / SCOPES_FILE).write_text(f"# scopes\n{key_id}: {entry}\n")
    lines, c = compile_with(tmp_path)
    assert c is None
    wanted = f"{region_dir / SCOPES_FILE}:2: {field.format(kid=key_id)}: "
    assert any(line.startswith(wanted) and why in line for line in lines), lines
    assert all("\n" not in line for line in lines)


def test_a_scope_for_a_key_without_its_pub_is_refused(tmp_path: Path) -> None:
    hall_key(tmp_path, "A")
    region_dir = tmp_path / "notice-keys" / "r1"
    with (region_dir / SCOPES_FILE).open("a") as f:
        f.write("00000000deadbeef: {halls: [B]}\n")
    lines, c = compile_with(tmp_path)
    assert c is None
    assert any("00000000deadbeef: no such key" in line for line in lines), lines


def test_a_scopes_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    region_dir = tmp_path / "notice-keys" / "r1"
    keys.generate(region_dir)
    (region_dir / SCOPES_FILE).write_text("- just\n- a list\n")
    lines, c = compile_with(tmp_path)
    assert c is None and any("(document): a mapping" in line for line in lines), lines


def test_an_empty_scopes_file_never_widens_to_region_wide(tmp_path: Path) -> None:
    region_dir = tmp_path / "notice-keys" / "r1"
    keys.generate(region_dir)
    (region_dir / SCOPES_FILE).write_text("# nothing yet\n")
    lines, c = compile_with(tmp_path)
    assert c is None and any("names no live key" in line for line in lines), lines


def test_a_key_without_an_entry_is_warned_about_and_signs_for_no_hall(tmp_path: Path) -> None:
    for hall in "ABCD":
        hall_key(tmp_path, hall)
    stray, _, _ = keys.generate(tmp_path / "notice-keys" / "r1")
    lines, c = compile_with(tmp_path)
    assert c is not None, lines
    assert any(stray in line and "signs for no hall" in line for line in lines), lines
    p = c.notice_policy("r1")
    assert p is not None and stray in p.keys and stray not in p.scopes


def test_rotation_the_retired_key_is_carried_with_not_after_then_left_out(
    tmp_path: Path,
) -> None:
    old = {hall: hall_key(tmp_path, hall) for hall in "ABCD"}
    new_a = hall_key(tmp_path, "A")
    region_dir = tmp_path / "notice-keys" / "r1"
    retire_at = NOW + timedelta(seconds=150)
    retire_key(region_dir, old["A"], retire_at)
    lines, c = compile_with(tmp_path)
    assert c is not None, lines
    p = c.notice_policy("r1")
    assert p is not None
    assert p.scopes[old["A"]].not_after == retire_at and p.scopes[new_a].not_after is None
    # A bundle compiled after the retirement leaves the key out altogether.
    lines, c = compile_with(tmp_path, created_at=retire_at + timedelta(seconds=1))
    assert c is not None, lines
    p = c.notice_policy("r1")
    assert p is not None and old["A"] not in p.keys and new_a in p.keys
    warned = [line for line in lines if old["A"] in line]
    assert warned and "left out of the bundle" in warned[0] and "[warning]" in warned[0]
    assert Severity.WARNING.value in warned[0]


def test_a_key_id_yaml_reads_as_a_number_is_asked_to_be_quoted(tmp_path: Path) -> None:
    region_dir = tmp_path / "notice-keys" / "r1"
    keys.generate(region_dir)
    (region_dir / SCOPES_FILE).write_text("1234567890123456: {halls: [A]}\n")
    lines, c = compile_with(tmp_path)
    assert c is None
    assert any(":1: 1234567890123456: a key id is a string" in line for line in lines), lines
