"""Provider calls that several workflows make the same way (deterministic workflow code).

`delete_instance` is the budgeted, idempotent delete: one token per attempt, retried with
backoff while retrying can help (the activity was lost, 503, 429), so an instance that
should go is never left behind by a transient error.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from activities.provider.activities import InstanceRef, ProviderActivities
    from workflows.budget.client import BudgetClient

#: Provider errors worth another attempt (each attempt takes a token).
RETRIED_BY_US = frozenset({"Transient", "RateLimited"})


def lost(exc: BaseException) -> bool:
    """The activity timed out: the worker running it died, or the call hung. The create or
    delete may or may not have happened; both are idempotent, so the answer is to retry."""
    return isinstance(exc, ActivityError) and isinstance(exc.cause, TemporalTimeoutError)


def error_type(exc: BaseException) -> str:
    cause = exc.cause if isinstance(exc, ActivityError) else exc
    return cause.type or "" if isinstance(cause, ApplicationError) else ""


async def delete_instance(budget: BudgetClient, region: str, provider_id: str) -> None:
    """Delete until the provider says it is done; other errors raise ActivityError."""
    attempt = 0
    while True:
        await budget.take(region, 1)
        try:
            await workflow.execute_activity_method(
                ProviderActivities.delete_instance,
                InstanceRef(provider_id=provider_id),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
            return
        except ActivityError as exc:
            # Deleting is a desired state and idempotent: keep at it while it can work.
            if lost(exc) or error_type(exc) in RETRIED_BY_US:
                attempt += 1
                await workflow.sleep(timedelta(seconds=min(30, 2 ** min(attempt, 5))))
                continue
            raise
