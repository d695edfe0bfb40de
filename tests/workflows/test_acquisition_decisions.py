"""The acquisition's pure decisions (workflows/acquisition/decisions.py), a row per case:
what follows a failed create, and the committed fallback's verdict."""

from __future__ import annotations

from datetime import timedelta

import pytest

from workflows.acquisition.decisions import (
    CreateNext,
    CreateRetry,
    FallbackVerdict,
    create_retry,
    fallback_verdict,
)
from workflows.acquisition.models import ApprovalInput, FallbackState
from workflows.provider_calls import RETRIED_BY_US

BOUND = timedelta(seconds=900)


@pytest.mark.parametrize(
    ("lost", "kind", "attempt", "elapsed_s", "expected"),
    [
        pytest.param(True, "", 0, 10, CreateRetry(CreateNext.RETRY_LOST, 0, 1.0), id="lost-first"),
        pytest.param(
            True, "", 3, 10, CreateRetry(CreateNext.RETRY_LOST, 3, 8.0), id="lost-after-3"
        ),
        pytest.param(
            True, "", 9, 10, CreateRetry(CreateNext.RETRY_LOST, 9, 30.0), id="lost-capped"
        ),
        pytest.param(
            True, "", 0, 900, CreateRetry(CreateNext.GIVE_UP_LOST, 0, 1.0), id="lost-at-bound"
        ),
        pytest.param(
            True, "", 2, 1200, CreateRetry(CreateNext.GIVE_UP_LOST, 2, 4.0), id="lost-past-bound"
        ),
        pytest.param(
            False, "Transient", 0, 10, CreateRetry(CreateNext.RETRY, 1, 2.0), id="transient-1st"
        ),
        pytest.param(
            False, "RateLimited", 3, 10, CreateRetry(CreateNext.RETRY, 4, 16.0), id="rate-4th"
        ),
        pytest.param(
            False, "Transient", 4, 10, CreateRetry(CreateNext.FAIL, 5), id="transient-out"
        ),
        pytest.param(
            False,
            "Transient",
            0,
            1200,
            CreateRetry(CreateNext.RETRY, 1, 2.0),
            id="answered-no-bound",
        ),
        pytest.param(
            False,
            "InsufficientCapacity",
            0,
            10,
            CreateRetry(CreateNext.FAIL, 1, capacity=True),
            id="capacity-at-once",
        ),
        pytest.param(False, "Permanent", 0, 10, CreateRetry(CreateNext.FAIL, 1), id="permanent"),
        pytest.param(False, "", 1, 10, CreateRetry(CreateNext.FAIL, 2), id="untyped-error"),
    ],
)
def test_create_retry(
    lost: bool, kind: str, attempt: int, elapsed_s: float, expected: CreateRetry
) -> None:
    got = create_retry(
        lost=lost,
        error_type=kind,
        attempt=attempt,
        max_attempts=5,
        elapsed=timedelta(seconds=elapsed_s),
        give_up=BOUND,
        retried=RETRIED_BY_US,
    )
    assert got == expected


def test_create_retry_with_one_attempt_never_retries_an_answer() -> None:
    got = create_retry(
        lost=False,
        error_type="Transient",
        attempt=0,
        max_attempts=1,
        elapsed=timedelta(0),
        give_up=BOUND,
        retried=RETRIED_BY_US,
    )
    assert got == CreateRetry(CreateNext.FAIL, 1)


ALICE_YES = ApprovalInput(approver="alice", reason="worth it", identity="CN=alice")
BOB_NO = ApprovalInput(approver="bob", reason="too dear", approve=False)


@pytest.mark.parametrize(
    ("needs_approval", "approval", "expected"),
    [
        pytest.param(
            False,
            None,
            FallbackVerdict(FallbackState.PROCEEDING, "proceed", "plan", "sco", "", False, True),
            id="within-authority",
        ),
        pytest.param(
            True,
            None,
            FallbackVerdict(
                FallbackState.DECLINED,
                "declined",
                "no approval within 600 s",
                "deadline",
                "",
                True,
                False,
            ),
            id="deadline",
        ),
        pytest.param(
            True,
            ALICE_YES,
            FallbackVerdict(
                FallbackState.APPROVED, "approved", "worth it", "alice", "CN=alice", True, True
            ),
            id="approved",
        ),
        pytest.param(
            True,
            BOB_NO,
            FallbackVerdict(FallbackState.DECLINED, "declined", "too dear", "bob", "", True, False),
            id="declined-by-operator",
        ),
    ],
)
def test_fallback_verdict(
    needs_approval: bool, approval: ApprovalInput | None, expected: FallbackVerdict
) -> None:
    got = fallback_verdict(
        needs_approval=needs_approval,
        approval=approval,
        approval_timeout_s=600.0,
        plan_reason="plan",
    )
    assert got == expected
