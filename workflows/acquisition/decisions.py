"""The acquisition's decisions as pure functions: what to do after a failed create, and the
committed fallback's verdict. No I/O, no clock, no Temporal: the workflow gathers the
facts, asks here, and does what the answer says (tests/workflows/test_acquisition_decisions.py
tables every case)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import timedelta

from workflows.acquisition.models import ApprovalInput, FallbackState

#: Longest wait between two create attempts, in seconds.
MAX_BACKOFF_S = 30.0


class CreateNext(enum.Enum):
    RETRY_LOST = "retry_lost"  # no answer: the create may have made it, ask again
    GIVE_UP_LOST = "give_up_lost"  # no answer within the build bound: the slot is given up
    RETRY = "retry"  # an answer worth another attempt (a token each)
    FAIL = "fail"  # an answer that retrying does not change, or out of attempts


@dataclass(frozen=True)
class CreateRetry:
    next: CreateNext
    #: Attempts answered so far (lost creates do not count: they may have worked).
    attempt: int
    #: Wait before the next attempt (RETRY, RETRY_LOST; GIVE_UP_LOST's when not bounded).
    backoff_s: float = 0.0
    #: FAIL on a capacity answer: counted as a capacity error of the pool.
    capacity: bool = False


def create_retry(
    *,
    lost: bool,
    error_type: str,
    attempt: int,
    max_attempts: int,
    elapsed: timedelta,
    give_up: timedelta,
    retried: frozenset[str],
) -> CreateRetry:
    """After a create that failed: `lost` when it had no answer (timed out), else the
    provider's `error_type`; `attempt` answered attempts before this one; `elapsed` since
    the slot's first create; `retried` the error types worth another attempt.

    GIVE_UP_LOST is honoured only under the bounded-create patch (histories from before it
    retry lost creates without a bound): its `backoff_s` is that retry's."""
    if lost:
        backoff = min(MAX_BACKOFF_S, float(2 ** min(attempt, 5)))
        gone = CreateNext.GIVE_UP_LOST if elapsed >= give_up else CreateNext.RETRY_LOST
        return CreateRetry(gone, attempt, backoff)
    attempt += 1
    if error_type in retried and attempt < max_attempts:
        return CreateRetry(CreateNext.RETRY, attempt, min(MAX_BACKOFF_S, float(2**attempt)))
    return CreateRetry(CreateNext.FAIL, attempt, capacity=error_type == "InsufficientCapacity")


@dataclass(frozen=True)
class FallbackVerdict:
    state: FallbackState
    outcome: str  # the ledger decision's outcome
    reason: str
    actor: str
    identity: str
    #: An operator or the deadline decided: the progress shows who and why.
    decided: bool
    #: Boot the committed capacity (else its units are short).
    launch: bool


def fallback_verdict(
    *,
    needs_approval: bool,
    approval: ApprovalInput | None,
    approval_timeout_s: float,
    plan_reason: str,
) -> FallbackVerdict:
    """The committed fallback's verdict, once any approval wait is over: within authority
    it proceeds; above it, an approval approves, a refusal or the deadline (`approval`
    None) declines."""
    if not needs_approval:
        return FallbackVerdict(
            FallbackState.PROCEEDING,
            "proceed",
            plan_reason,
            actor="sco",
            identity="",
            decided=False,
            launch=True,
        )
    if approval is None:
        return FallbackVerdict(
            FallbackState.DECLINED,
            "declined",
            f"no approval within {approval_timeout_s:.0f} s",
            actor="deadline",
            identity="",
            decided=True,
            launch=False,
        )
    approved = approval.approve
    return FallbackVerdict(
        FallbackState.APPROVED if approved else FallbackState.DECLINED,
        "approved" if approved else "declined",
        approval.reason,
        actor=approval.approver,
        identity=approval.identity,
        decided=True,
        launch=approved,
    )
