"""The node's readings without pydantic (decision 0041) against the control plane's.

Notices and notice policies are one class on both sides (contracts/notice.py): their wire
bytes must be those of the pydantic models they replaced, or every node in the estate
refuses every notice. A bundle is read twice, fully by the control plane
(contracts.bundle.BundleContent) and as drain terms by a node (contracts.node_bundle): both
must see the same contracts, and the node's reading must refuse, in one line, what it
cannot act on.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey
from pydantic import TypeAdapter

from contracts import bundle
from contracts.keys import TrustStore, key_id
from contracts.node_bundle import NodeBundle, parse_node_content
from contracts.notice import KeyScope, NoticePolicy, NoticeStage, ReclaimNotice
from contracts.notice_signing import sign
from contracts.records import RecordError, json_datetime
from contracts.signed_bundle import BundleRejected, verify_as
from contracts.source import read_contracts
from tests.support.paths import EXAMPLES

pytestmark = pytest.mark.timeout(60)

GOLDEN = json.loads((Path(__file__).parent / "golden" / "wire_before_0041.json").read_text())
KEY = SigningKey(bytes(range(32)))
T = datetime(2026, 12, 7, 10, 0, 0, 123456, tzinfo=UTC)


def test_notices_sign_to_the_bytes_of_the_pydantic_models_they_replaced() -> None:
    """Golden bytes written by the models before decision 0041 (commit ff93e05)."""
    hard = ReclaimNotice(
        notice_id="abc", region="r1", hall="D", node="n-1", pool_id="r1/D/x", issued_at=T,
        deadline=T + timedelta(seconds=120), reason="operator reclaim",
    )  # fmt: skip
    early = ReclaimNotice(
        notice_id="def", region="r1", hall="D", node="n-1", pool_id="r1/D/x",
        issued_at=T.replace(microsecond=0), deadline=T + timedelta(days=2),
        stage=NoticeStage.EARLY,
    )  # fmt: skip
    assert sign(hard, KEY).decode() == GOLDEN["hard"]
    assert sign(early, KEY).decode() == GOLDEN["early"]
    for raw in (GOLDEN["hard"], GOLDEN["early"]):
        body = json.loads(raw)["notice"]
        assert ReclaimNotice.from_json(body).to_json() == body


def test_a_bundle_with_scoped_policies_keeps_its_bytes() -> None:
    policies = [
        NoticePolicy(
            region="r1", lead_seconds=120, keys={"a" * 16: "b" * 64, "c" * 16: "d" * 64},
            scopes={"a" * 16: KeyScope(halls=["D", "C"], not_after=T),
                    "c" * 16: KeyScope(halls=["A"])},
        ),
        NoticePolicy(region="r2", lead_seconds=60, keys={"e" * 16: "f" * 64}),
    ]  # fmt: skip
    raw = bundle.build([], serial=7, created_at=T, key=KEY, notice_policies=policies)
    assert raw.decode() == GOLDEN["bundle"]
    trust = TrustStore(keys={key_id(KEY.verify_key): KEY.verify_key}, revoked=frozenset())
    full = bundle.verify(raw, trust, now=T).content
    node = verify_as(raw, trust, parse_node_content, now=T).content
    assert full.notice_policies == node.notice_policies == policies
    assert node.notice_policies[0].scopes["a" * 16].halls == ["C", "D"]  # sorted, as before


def terms(contract: Any) -> tuple[object, ...]:
    """What a node drains by, read off either reading of a contract."""
    s, d = contract.selectors, contract.drain
    return (
        contract.name,
        [(k.namespace, dict(k.labels)) for k in s.kubernetes],
        [(x.account, x.partition, x.tag, contract.slurm_tag(x)) for x in s.slurm],
        (d.action, d.grace_seconds, d.checkpoint_uri, d.early_warning),
    )


def test_the_node_reads_every_example_contract_as_the_control_plane_does() -> None:
    sources, findings = read_contracts(EXAMPLES)
    assert not findings and len(sources) >= 3
    content = bundle.BundleContent(
        serial=3, created_at=T, regions=["r1"], contracts=[s.contract for s in sources]
    )
    node = content.as_node()
    assert isinstance(node, NodeBundle)
    assert [terms(c) for c in node.contracts] == [terms(c) for c in content.contracts]
    assert (node.serial, node.created_at, node.regions) == (3, T, ["r1"])
    assert {c.drain.early_warning for c in node.contracts} <= {"none", "checkpoint", "decommission"}


def example_doc() -> dict[str, Any]:
    sources, _ = read_contracts(EXAMPLES)
    content = bundle.BundleContent(
        serial=3, created_at=T, regions=["r1"], contracts=[sources[0].contract]
    )
    doc = content.model_dump(mode="json")
    del doc["source"]
    return doc


def test_the_rest_of_a_contract_is_the_control_planes() -> None:
    """A field a newer compiler adds outside drain and selectors: not read, not refused."""
    doc = example_doc()
    doc["contracts"][0]["placement"]["new_knob"] = 3
    doc["contracts"][0]["future_field"] = {"x": 1}
    assert parse_node_content(doc).contracts[0].name == doc["contracts"][0]["name"]


@pytest.mark.parametrize(
    ("path", "value", "why"),
    [
        (("drain", "shiny"), 1, "contracts[0].drain.shiny: extra field not permitted"),
        (("drain", "action"), "explode", "contracts[0].drain.action: expected one of"),
        (("drain", "grace_seconds"), "60", "contracts[0].drain.grace_seconds: expected an integer"),
        (("drain", "grace_seconds"), True, "contracts[0].drain.grace_seconds: expected an integer"),
        (("selectors", "slurm"), {}, "contracts[0].selectors.slurm: expected an array"),
        (("selectors", "pbs"), [], "contracts[0].selectors.pbs: extra field not permitted"),
        (("name",), 7, "contracts[0].name: expected a string, got int"),
    ],
)
def test_what_a_node_acts_on_is_refused_in_one_line_naming_the_field(
    path: tuple[str, ...], value: object, why: str
) -> None:
    doc = example_doc()
    target = doc["contracts"][0]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(BundleRejected) as err:
        parse_node_content(doc)
    assert why in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"serial": 0}, "serial: expected 1 to"),
        ({"serial": 2**53 + 1}, "serial: expected 1 to"),
        ({"format": 2}, "format: expected 1"),
        ({"created_at": "2026-12-07T10:00:00"}, "created_at: needs a timezone"),
        ({"created_at": "yesterday"}, "created_at: 'yesterday' is not an ISO 8601 date-time"),
        ({"created_at": "9" * 200}, "created_at: expected an ISO 8601 date-time"),
        ({"contracts": [[]]}, "contracts[0]: expected an object, got an array"),
        ({"extra": 1}, "extra: extra field not permitted"),
        ({"notice_policies": [{"region": "r1", "lead_seconds": 0}]}, "greater than 0"),
        ({"notice_policies": [{"region": "r1", "lead_seconds": 5, "keys": {"k": 5}}]},
         "notice_policies[0].keys.k: expected a string"),
    ],
)  # fmt: skip
def test_bad_content_is_refused_in_one_line(change: dict[str, object], why: str) -> None:
    doc = {**example_doc(), **change}
    with pytest.raises(BundleRejected) as err:
        parse_node_content(doc)
    assert why in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"stage": "later"}, "stage: expected one of 'hard', 'early'"),
        ({"colour": "red"}, "colour: extra field not permitted"),
        ({"deadline": 1765100000}, "deadline: expected an ISO 8601 date-time, got int"),
        ({"node": None}, "node: expected a string, got NoneType"),
        ({"region": ["r1"]}, "region: expected a string, got an array"),
    ],
)
def test_a_notice_body_that_is_not_a_notice_says_which_field(
    change: dict[str, object], why: str
) -> None:
    body = {**json.loads(GOLDEN["hard"])["notice"], **change}
    with pytest.raises(RecordError, match=why):
        ReclaimNotice.from_json(body)
    missing = json.loads(GOLDEN["hard"])["notice"]
    del missing["pool_id"]
    with pytest.raises(RecordError, match=r"notice\.pool_id: field required"):
        ReclaimNotice.from_json(missing)


def test_a_key_scope_is_checked_by_its_own_class_on_both_sides() -> None:
    with pytest.raises(RecordError, match=r"halls: .* listed twice"):
        KeyScope(halls=["D", "D"])
    with pytest.raises(RecordError, match="cannot be a NATS subject token"):
        KeyScope.from_json({"halls": ["D.>"]}, "k")
    with pytest.raises(RecordError, match=r"k\.not_after: needs a timezone"):
        KeyScope.from_json({"halls": ["D"], "not_after": "2026-12-07T10:00:00"}, "k")
    with pytest.raises(ValueError, match="scopes of keys the policy does not list: x"):
        bundle.BundleContent.model_validate(
            {**example_doc(), "notice_policies": [
                {"region": "r1", "lead_seconds": 5, "scopes": {"x": {"halls": ["D"]}}}]},
            strict=False,
        )  # fmt: skip


@pytest.mark.parametrize(
    "when",
    [
        T,
        T.replace(microsecond=0),
        T.replace(microsecond=500000),
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        T.astimezone(timezone(timedelta(hours=2))),
        T.astimezone(timezone(timedelta(hours=-9, minutes=-30))),
        datetime(2026, 1, 1, tzinfo=timezone(timedelta(0))),
        datetime(2026, 1, 1),
    ],
)
def test_a_datetime_is_written_as_pydantic_wrote_it(when: datetime) -> None:
    assert json_datetime(when) == TypeAdapter(datetime).dump_python(when, mode="json")
