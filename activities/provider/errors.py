"""Typed provider errors, each with its Temporal retry semantics.

Throttling is never capacity: a 429 is RateLimited (retry after the delay it names), a
NoValidHost or exhausted quota is InsufficientCapacity (not retried: the acquisition
reports a shortfall and the planner moves on).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from temporalio.exceptions import ApplicationError


class ProviderError(Exception):
    """Base of every provider error. `retryable` says whether a retry can succeed."""

    retryable = False

    def to_application_error(self) -> ApplicationError:
        # Imported here: the notice relay and the simulator raise these errors without
        # Temporal, and temporalio's import alone is ~30 MB.
        from temporalio.exceptions import ApplicationError

        return ApplicationError(
            str(self),
            type=type(self).__name__,
            non_retryable=not self.retryable,
            next_retry_delay=getattr(self, "retry_after", None),
        )


class InsufficientCapacity(ProviderError):
    """NoValidHost, quota exhausted, pool empty: a shortfall, not a failure."""


class NotFound(ProviderError):
    """The instance or reservation does not exist (any more)."""


class RateLimited(ProviderError):
    """HTTP 429: the API budget is exhausted; retry after `retry_after`."""

    retryable = True

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = timedelta(seconds=retry_after) if retry_after else None


class Transient(ProviderError):
    """5xx, timeouts, connection resets: retry with backoff."""

    retryable = True


class Permanent(ProviderError):
    """Auth failures, bad requests, unknown flavors: retrying cannot help."""
