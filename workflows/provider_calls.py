"""Provider calls that several workflows make the same way (deterministic workflow code).

`delete_instance` is the budgeted, idempotent delete: one token per attempt, retried with
backoff while retrying can help (the activity was lost, 503, 429), so an instance that
should go is never left behind by a transient error. `reserve` makes a Blazar reservation
and waits until it is ACTIVE (committed capacity for floors and fallback). `record_release`
writes what a release leaves behind: the DELETE lifecycle event and the release decision.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from activities.control.activities import ControlActivities
    from activities.decisions import Decision, DecisionKind
    from activities.events import EventKind
    from activities.fleet.activities import FleetActivities, RecordEventInput
    from activities.provider.activities import (
        InstanceRef,
        LeaseRef,
        ProviderActivities,
        WaitReservationInput,
    )
    from activities.provider.interface import Reservation, ReservationRequest
    from workflows.budget.client import BudgetClient

#: Provider errors worth another attempt (each attempt takes a token).
RETRIED_BY_US = frozenset({"Transient", "RateLimited"})
#: Retrying these would not help: capacity is a shortfall, the rest is a bug or gone.
NOT_RETRIED = ["InsufficientCapacity", "NotFound", "Permanent"]
#: Fleet-state writes: retried through a database switchover.
STATE_RETRY = RetryPolicy(maximum_attempts=20, maximum_interval=timedelta(seconds=30))


def lost(exc: BaseException) -> bool:
    """The activity timed out: the worker running it died, or the call hung. The create or
    delete may or may not have happened; both are idempotent, so the answer is to retry."""
    return isinstance(exc, ActivityError) and isinstance(exc.cause, TemporalTimeoutError)


def error_type(exc: BaseException) -> str:
    cause = exc.cause if isinstance(exc, ActivityError) else exc
    return cause.type or "" if isinstance(cause, ApplicationError) else ""


async def delete_instance(
    budget: BudgetClient,
    region: str,
    provider_id: str,
    *,
    attempts: int | None = None,
    call_timeout: timedelta = timedelta(seconds=60),
) -> bool:
    """The one budgeted delete: a token per attempt, backoff between attempts.

    `attempts=None`: delete until the provider says it is done, retrying while retrying can
    help; another error raises ActivityError. `attempts=N`: give up after N attempts of any
    kind and return False (logged), for callers that try again later on their own (the
    controller's next tick, the floor keeper's next round, the next probe's leftovers).
    An instance the provider no longer has counts as deleted."""
    attempt = 0
    while True:
        await budget.take(region, 1)
        try:
            await workflow.execute_activity_method(
                ProviderActivities.delete_instance,
                InstanceRef(provider_id=provider_id),
                start_to_close_timeout=call_timeout,
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
            return True
        except ActivityError as exc:
            if error_type(exc) == "NotFound":
                return True
            attempt += 1
            if attempts is not None and attempt >= attempts:
                workflow.logger.warning("delete of %s: gave up: %s", provider_id, exc.cause)
                return False
            # Deleting is a desired state and idempotent: keep at it while it can work.
            if attempts is None and not (lost(exc) or error_type(exc) in RETRIED_BY_US):
                raise
            await workflow.sleep(timedelta(seconds=min(30, 2 ** min(attempt, 5))))


async def record_release(
    *,
    region: str,
    instance_id: str,
    subject: str,
    event_reason: str,
    decision_reason: str,
    price_per_hour: float,
    at: datetime,
    outcome: str = "released",
) -> None:
    """The instance is gone: DELETE in fleet state (its event through the outbox), and a
    release decision (who, why, what it cost) in the ledger."""
    await workflow.execute_activity_method(
        FleetActivities.record_event,
        RecordEventInput(instance_id=instance_id, kind=EventKind.DELETE, reason=event_reason),
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=STATE_RETRY,
    )
    await workflow.execute_activity_method(
        ControlActivities.record_decision,
        Decision(
            event_id=workflow.uuid4(),
            occurred_at=at,
            region=region,
            kind=DecisionKind.RELEASE,
            subject=subject,
            outcome=outcome,
            reason=decision_reason,
            amount_per_hour=price_per_hour,
            units=1,
            workflow_id=workflow.info().workflow_id,
        ),
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=STATE_RETRY,
    )


async def reserve(
    budget: BudgetClient,
    request: ReservationRequest,
    *,
    poll_seconds: float = 2.0,
    wait: timedelta = timedelta(minutes=10),
) -> Reservation | None:
    """A Blazar reservation (one token), waited for until ACTIVE; None when the hall has no
    room or the lease never starts (logged): the caller counts it as a shortfall. A lease
    that was made but never became ACTIVE is deleted (one more token): left alone it would
    start later and hold committed capacity nobody boots into."""
    await budget.take(request.region, 1)
    res: Reservation | None = None
    try:
        res = await workflow.execute_activity_method(
            ProviderActivities.create_reservation,
            request,
            start_to_close_timeout=timedelta(seconds=120),
            retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=NOT_RETRIED),
        )
        await workflow.execute_activity_method(
            ProviderActivities.wait_reservation_active,
            WaitReservationInput(
                region=request.region, lease_id=res.lease_id, poll_seconds=poll_seconds
            ),
            start_to_close_timeout=wait,
            # The wait is bounded in all: a lease stuck PENDING is not waited for forever.
            schedule_to_close_timeout=wait,
            heartbeat_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(non_retryable_error_types=NOT_RETRIED),
        )
    except ActivityError as exc:
        workflow.logger.warning(
            "reservation %s in %s failed: %s", request.name, request.hall, exc.cause
        )
        if res is not None and workflow.patched("delete-unstarted-lease"):
            await delete_lease(budget, request.region, res.lease_id)
        return None
    return res


async def delete_lease(budget: BudgetClient, region: str, lease_id: str) -> bool:
    """One budgeted lease delete, three attempts; False (logged) when it did not go: the
    region's reconciler deletes what is left."""
    await budget.take(region, 1)
    try:
        await workflow.execute_activity_method(
            ProviderActivities.delete_reservation,
            LeaseRef(lease_id=lease_id),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
    except ActivityError as exc:
        workflow.logger.warning("deleting lease %s: %s", lease_id, exc.cause)
        return False
    return True
