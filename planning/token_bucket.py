"""A token bucket on an injected clock: the arithmetic behind TokenBudgetWorkflow.

Pure (no clock of its own, no I/O), so the budget workflow runs it on `workflow.now()` and
replays it exactly, and its state is a plain model that survives continue-as-new.

Invariant: over any interval [t, t+T], tokens taken <= burst + rate*T. The bucket never
holds more than `burst` and gains at most `rate*T` in T; `take` never hands out more than
it holds (up to EPSILON of float slack per take).
"""

from __future__ import annotations

import math
from datetime import datetime

from pydantic import BaseModel

EPSILON = 1e-9
"""Float slack when counting whole tokens. 0.1 s at 10/s can come out 0.9999999999 tokens;
without the slack the bucket would grant nothing and ask for a sub-millisecond timer. The
price is an overdraw of at most EPSILON per take, which is then written off (tokens never
go negative)."""


class BucketState(BaseModel):
    rate_per_second: float
    burst: int
    tokens: float
    updated_at: datetime


class TokenBucket:
    """Holds at most `burst` tokens and refills at `rate_per_second`; rate 0 pauses it.

    Time that runs backwards (a `now` before the last update) refills nothing.
    """

    def __init__(self, state: BucketState) -> None:
        _check(state.rate_per_second, state.burst)
        self._state = state.model_copy()

    @classmethod
    def full(cls, rate_per_second: float, burst: int, now: datetime) -> TokenBucket:
        """A bucket that starts full: `burst` tokens may go at once."""
        return cls(
            BucketState(
                rate_per_second=rate_per_second, burst=burst, tokens=float(burst), updated_at=now
            )
        )

    @property
    def state(self) -> BucketState:
        return self._state.model_copy()

    @property
    def rate_per_second(self) -> float:
        return self._state.rate_per_second

    @property
    def burst(self) -> int:
        return self._state.burst

    def available(self, now: datetime) -> float:
        """Tokens the bucket would hold at `now`, without changing it."""
        elapsed = (now - self._state.updated_at).total_seconds()
        if elapsed <= 0:
            return self._state.tokens
        return min(
            float(self._state.burst), self._state.tokens + elapsed * self._state.rate_per_second
        )

    def refill(self, now: datetime) -> None:
        if now > self._state.updated_at:
            self._state.tokens = self.available(now)
            self._state.updated_at = now

    def take(self, now: datetime, wanted: int) -> int:
        """Take min(wanted, whole tokens available) and return how many were taken."""
        self.refill(now)
        granted = min(wanted, math.floor(self._state.tokens + EPSILON))
        if granted <= 0:
            return 0
        self._state.tokens = max(0.0, self._state.tokens - granted)
        return granted

    def seconds_until(self, now: datetime, tokens: int = 1) -> float:
        """Seconds from `now` until `tokens` (capped at burst) are available; 0 if they are
        now, infinity if the bucket is paused."""
        wanted = min(tokens, self._state.burst)
        missing = wanted - self.available(now) - EPSILON
        if missing <= 0:
            return 0.0
        if self._state.rate_per_second <= 0:
            return math.inf
        return missing / self._state.rate_per_second

    def reconfigure(self, now: datetime, rate_per_second: float, burst: int) -> None:
        """New rate and burst from `now` on: what accrued so far accrued at the old rate, and
        a smaller burst cuts the tokens held (a larger one adds none)."""
        _check(rate_per_second, burst)
        self.refill(now)
        self._state.rate_per_second = rate_per_second
        self._state.burst = burst
        self._state.tokens = min(self._state.tokens, float(burst))


def _check(rate_per_second: float, burst: int) -> None:
    if not (math.isfinite(rate_per_second) and rate_per_second >= 0):
        raise ValueError(f"rate_per_second must be finite and >= 0, not {rate_per_second}")
    if burst < 1:
        raise ValueError(f"burst must be >= 1, not {burst}")
