"""Capped exponential backoff for a process loop waiting out a dependency's outage."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class CappedBackoff:
    """Delays that double from `initial` to `cap`, with jitter so many processes that lost
    the same dependency do not retry in step; `reset()` after the first success."""

    initial: float = 0.5
    cap: float = 30.0
    failures: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def next(self) -> float:
        delay = min(self.cap, self.initial * 2.0**self.failures)
        self.failures += 1
        # Up to 20 % off, never above the cap: the cap is the promise to an operator.
        return delay * (0.8 + 0.2 * self._rng.random())

    def reset(self) -> None:
        self.failures = 0
