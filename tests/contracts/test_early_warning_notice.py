"""Early warnings: signed like every notice, refused when forged, harmless to old agents."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from contracts.bundle import canonical_json
from contracts.model import Contract, DrainAction, EarlyWarningAction
from contracts.notice import NoticeStage, ReclaimNotice
from contracts.notice_signing import Accepted, RefusalReason, check, sign
from contracts.reclaim import ReclaimRequest
from contracts.source import read_contracts
from tests.contracts.test_notice_signing import ME, NOW, RELAY, STRANGER, content, notice, refused
from tests.support.paths import EXAMPLES


def early(*, deadline_s: float = 3600) -> ReclaimNotice:
    at = NOW + timedelta(seconds=deadline_s)
    return notice(deadline_s=deadline_s).replace(
        **{"notice_id": ReclaimNotice.early_id("r1", "node-1", at), "stage": NoticeStage.EARLY}
    )


class PreEarlyWarningNotice(BaseModel):
    """ReclaimNotice as agents before early warnings have it (no `stage`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    notice_id: str
    region: str
    hall: str
    node: str
    pool_id: str
    issued_at: datetime
    deadline: datetime
    reason: str = ""


def test_a_hard_notice_is_signed_over_the_same_bytes_as_before() -> None:
    body = json.loads(sign(notice(), RELAY))["notice"]
    assert "stage" not in body
    assert PreEarlyWarningNotice.model_validate(body).notice_id == notice().notice_id


def test_a_signed_early_warning_is_accepted_with_its_far_deadline() -> None:
    result = check(sign(early(deadline_s=10 * 86400), RELAY), content(RELAY), ME, NOW)
    assert isinstance(result, Accepted), result
    assert result.notice.early and result.notice.deadline == NOW + timedelta(days=10)
    assert result.notice.notice_id != notice().notice_id  # acted on apart from the hard one


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (sign(early(deadline_s=32 * 86400), RELAY), RefusalReason.DEADLINE_TOO_FAR),
        (sign(early(), STRANGER), RefusalReason.UNKNOWN_KEY),
        (json.dumps(early().to_json()).encode(), RefusalReason.UNSIGNED),
        (sign(early(deadline_s=-5), RELAY), RefusalReason.EXPIRED),
    ],
)
def test_bad_early_warnings_are_refused(raw: bytes, reason: RefusalReason) -> None:
    assert refused(check(raw, content(RELAY), ME, NOW)) is reason


@pytest.mark.parametrize("stage", ["early", "hard"])
def test_the_stage_cannot_be_changed_without_breaking_the_signature(stage: str) -> None:
    """A hard notice relabelled early (to skip the drain), or an early one relabelled hard
    (to drain now), is a forgery."""
    source = notice() if stage == "early" else early()
    doc = json.loads(sign(source, RELAY))
    if stage == "early":
        doc["notice"]["stage"] = "early"
    else:
        del doc["notice"]["stage"]
    assert refused(check(canonical_json(doc), content(RELAY), ME, NOW)) is (
        RefusalReason.BAD_SIGNATURE
    )


def test_an_agent_before_early_warnings_refuses_one_as_malformed() -> None:
    """Its strict model forbids `stage`: check() there ends in MALFORMED (logged, never
    cordons or drains), and the hard notice that follows is what it acts on."""
    body = json.loads(sign(early(), RELAY))["notice"]
    with pytest.raises(ValidationError, match="stage"):
        PreEarlyWarningNotice.model_validate(body)


def test_a_reclaim_request_for_now_reads_as_before() -> None:
    assert "at" not in json.loads(ReclaimRequest(instances=["i-1"]).model_dump_json())
    at = NOW + timedelta(hours=1)
    planned = ReclaimRequest.model_validate_json(ReclaimRequest(at=at).model_dump_json())
    assert planned.at == at


def _contract(name: str) -> Contract:
    sources, _ = read_contracts(EXAMPLES)
    return next(s.contract for s in sources if s.contract.name == name)


def test_an_opt_in_travels_in_the_bundle_and_its_absence_changes_no_bytes() -> None:
    train = _contract("llm-train")
    assert "early_warning" not in train.model_dump(mode="json")["drain"]
    opted = train.model_copy(
        update={
            "drain": train.drain.model_copy(update={"early_warning": EarlyWarningAction.CHECKPOINT})
        }
    )
    dumped = opted.model_dump(mode="json")
    assert dumped["drain"]["early_warning"] == "checkpoint"
    assert (
        Contract.model_validate(dumped, strict=False).drain.early_warning
        is EarlyWarningAction.CHECKPOINT
    )


def test_an_early_warning_action_needs_the_matching_drain() -> None:
    with pytest.raises(
        ValidationError, match="early_warning: decommission needs action decommission"
    ):
        Contract.model_validate(
            {
                **_contract("llm-train").model_dump(mode="json"),
                "drain": {
                    "action": DrainAction.CHECKPOINT.value,
                    "grace_seconds": 60,
                    "checkpoint_uri": "file:///ckpt",
                    "early_warning": "decommission",
                },
            },
            strict=False,
        )


@pytest.mark.parametrize(
    ("value", "finding"),
    [
        ("checkpoint", None),
        (
            "sometimes",
            "drain.early_warning: Input should be 'none', 'checkpoint' or 'decommission'",
        ),
    ],
)
def test_the_opt_in_is_read_from_the_contract_file(
    value: str, finding: str | None, tmp_path: Path
) -> None:
    text = (EXAMPLES / "llm-train.yaml").read_text()
    anchor = "  checkpoint_uri: s3://checkpoints/llm-train\n"
    (tmp_path / "llm-train.yaml").write_text(
        text.replace(anchor, f"{anchor}  early_warning: {value}\n")
    )
    sources, findings = read_contracts(tmp_path)
    if finding is None:
        assert not findings
        assert sources[0].contract.drain.early_warning is EarlyWarningAction.CHECKPOINT
    else:
        assert [str(f) for f in findings] == [f"{tmp_path}/llm-train.yaml:26: {finding}"]
