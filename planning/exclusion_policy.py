"""The pool exclusion cycle's arithmetic: a sliding window of reclaim notices, the
threshold that excludes a pool, the cool-down before it is probed and when its strikes
are forgiven.

Pure functions of their arguments (times and the random draw are passed in), so the
workflow stays deterministic, these are unit-tested without Temporal, and the estate
simulator (estate/) drives the very same cycle in simulated time.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

#: 2**MAX_DOUBLINGS * base is far above any sensible cap; bounds the float arithmetic.
MAX_DOUBLINGS = 40


def window_start(now: datetime, window: timedelta, since: datetime | None = None) -> datetime:
    """The oldest notice time that still counts: `window` back from now, but never before
    `since` (the last re-admission: notices before it were answered by a clean probe)."""
    start = now - window
    return start if since is None or since < start else since


def add_notice(
    notices: dict[str, datetime], instance_id: str, at: datetime, now: datetime, window: timedelta
) -> bool:
    """Record a notice, deduplicated by instance id; True when it is new and in the window.

    A notice stamped in the future (a fast sender clock) counts as now; one older than the
    window is not kept: a republished old notice never counts twice."""
    at = min(at, now)
    if at < now - window or instance_id in notices:
        return False
    notices[instance_id] = at
    return True


def prune(notices: Mapping[str, datetime], now: datetime, window: timedelta) -> dict[str, datetime]:
    """The notices still in the window (what is carried over continue-as-new)."""
    return {i: at for i, at in notices.items() if at >= now - window}


def count_in_window(
    notices: Mapping[str, datetime],
    now: datetime,
    window: timedelta,
    since: datetime | None = None,
) -> int:
    start = window_start(now, window, since)
    return sum(1 for at in notices.values() if start <= at <= now)


def count_bursts(
    notices: Mapping[str, datetime],
    now: datetime,
    window: timedelta,
    since: datetime | None = None,
    merge: timedelta = timedelta(0),
) -> int:
    """Reclaim events in the window: notices within `merge` of the first notice of a
    burst count once. A provider taking back a slice of a pool at once (a co-reclaim)
    says one thing about the pool, however many instances it hits; a pool that keeps
    reclaiming says it again and again."""
    start = window_start(now, window, since)
    times = sorted(at for at in notices.values() if start <= at <= now)
    bursts, first = 0, None
    for at in times:
        if first is None or at - first > merge:
            bursts, first = bursts + 1, at
    return bursts


def over_threshold(count: int, threshold: int) -> bool:
    return count >= threshold


def cooldown(
    strikes: int,
    *,
    base: timedelta,
    cap: timedelta,
    jitter: float,
    draw: float,
) -> timedelta:
    """How long a pool with `strikes` strikes stays excluded before its probe.

    base * 2**(strikes-1), spread by +-`jitter` (a fraction) with `draw` in [0, 1) from
    `workflow.random()` so that pools excluded together are not all probed together, and
    never above `cap`."""
    if not 0.0 <= draw < 1.0:
        raise ValueError(f"draw must be in [0, 1), got {draw}")
    doublings = min(max(strikes, 1) - 1, MAX_DOUBLINGS)
    raw = min(base.total_seconds() * 2.0**doublings, cap.total_seconds())
    spread = raw * jitter * (2.0 * draw - 1.0)
    return timedelta(seconds=max(0.0, min(raw + spread, cap.total_seconds())))


def strikes_forgiven(
    strikes: int, admitted_since: datetime | None, now: datetime, clean_period: timedelta
) -> bool:
    """A pool re-admitted and clean (not excluded again) for `clean_period` starts over."""
    return strikes > 0 and admitted_since is not None and now - admitted_since >= clean_period
