"""The pool exclusion cycle's state machine: every decision the cycle takes, in one place,
for the workflow that runs it and the estate simulator that measures it.

    ADMITTED --threshold reclaim events in the window--> EXCLUDED --cool-down over--> PROBING
    PROBING --canary clean for the whole probe--> ADMITTED (counting starts over)
    PROBING --capacity error, no ACTIVE canary, a notice in the probe--> EXCLUDED (strikes + 1)
    ADMITTED --clean for strike_reset--> ADMITTED (strikes forgiven)
    any --operator exclude--> EXCLUDED
    EXCLUDED, PROBING --operator readmit--> ADMITTED (strikes 0)

Each `on_*` method reads the pool's state and one event and returns what the cycle decides:
a `Move` to a state, a `Forgive`, or None. `apply` and `forgive` are the only places a
decision changes the state, and `on_notice` the only place a notice is recorded. Nothing here
waits, writes or reads a clock: times and the cool-down's random draw are arguments, so the
workflow replays it (workflows/exclusion/workflow.py turns the decisions into timers, writes
and a canary) and the estate simulator drives it in simulated time (estate/exclusion.py).
The arithmetic (window, bursts, cool-down) is planning.exclusion_policy.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from planning import exclusion_policy as policy

#: Who the cycle itself acts as (decisions, history); rows it sets say set_by "cycle".
CYCLE_ACTOR = "sco"
CYCLE_SET_BY = "cycle"

#: The cool-down's random number in [0, 1) for a pool's `strikes`-th strike; asked for only
#: when a cool-down is decided (the workflow: `workflow.random()`, the simulator: a seed).
Draw = Callable[[int], float]


class PoolState(enum.StrEnum):
    """The `exclusions.state` values; the planner skips EXCLUDED and PROBING pools."""

    ADMITTED = "admitted"
    EXCLUDED = "excluded"
    PROBING = "probing"


@dataclass(frozen=True)
class CycleRules:
    """The cycle's settings (workflows.exclusion.models.ExclusionConfig, estate's config)."""

    window: timedelta
    threshold: int
    burst_merge: timedelta
    base_cooldown: timedelta
    max_cooldown: timedelta
    jitter: float
    probe: timedelta
    """How long a canary must stay clean for the pool to be re-admitted."""
    strike_reset: timedelta


class CycleState(Protocol):
    """What the cycle knows of one pool (the workflow's carried model; a simulator record)."""

    state: PoolState
    strikes: int
    reason: str
    set_by: str
    excluded_until: datetime | None
    """When the cool-down ends; None while EXCLUDED: until an operator re-admits the pool."""
    since: datetime | None
    admitted_since: datetime | None
    counted_since: datetime | None
    """Notices before this (the last re-admission) no longer count."""
    notices: dict[str, datetime]


@dataclass
class ProbeWatch:
    """A probe under way: notices from `since` on make it dirty (the first one says why)."""

    since: datetime
    dirty: str = ""


@dataclass(frozen=True)
class Move:
    """A transition decided by the cycle or asked for by an operator."""

    to: PoolState
    reason: str
    actor: str = CYCLE_ACTOR
    set_by: str = ""
    """The row's set_by; "" for "cycle" when the cycle moves, else the actor."""
    strikes: int | None = None
    """None: unchanged."""
    until: datetime | None = None
    """The end of the cool-down, for a move to EXCLUDED (None: until re-admitted)."""
    unless_there: bool = False
    """Nothing to do when the pool is already in `to` (two re-admissions accepted at once)."""


@dataclass(frozen=True)
class Forgive:
    """Strikes forgiven; the state stays."""

    reason: str


class ExclusionCycle:
    def __init__(self, rules: CycleRules) -> None:
        self.rules = rules

    # -- events ---------------------------------------------------------------------------

    def on_notice(
        self,
        s: CycleState,
        instance_id: str,
        at: datetime,
        now: datetime,
        probe: ProbeWatch | None = None,
    ) -> bool:
        """Record a reclaim notice; True when it is new (and in the window): then counting
        is due. A new notice during a probe makes the probe dirty."""
        at = min(at, now)
        if not policy.add_notice(s.notices, instance_id, at, now, self.rules.window):
            return False
        if (
            s.state is PoolState.PROBING
            and probe is not None
            and at >= probe.since
            and not probe.dirty
        ):
            probe.dirty = f"reclaim notice for {instance_id} during the probe"
        return True

    def on_check(self, s: CycleState, now: datetime) -> Forgive | None:
        """The periodic check of an admitted pool: strikes forgiven after a clean period."""
        r = self.rules
        if s.state is not PoolState.ADMITTED or not policy.strikes_forgiven(
            s.strikes, s.admitted_since, now, r.strike_reset
        ):
            return None
        return Forgive(
            f"admitted {r.strike_reset.total_seconds() / 3600:.0f} h without exclusion: "
            f"{s.strikes} strike(s) forgiven"
        )

    def on_count(
        self, s: CycleState, now: datetime, draw: Draw, *, burst_counting: bool = True
    ) -> Move | None:
        """Reclaims counted against the threshold: past it an admitted pool is excluded.

        Without `burst_counting` every notice is its own event (histories from before it)."""
        r = self.rules
        if s.state is not PoolState.ADMITTED:
            return None
        n, counted = self.reclaim_events(s, now, burst_counting=burst_counting)
        if not policy.over_threshold(n, r.threshold):
            return None
        return self._exclude(
            s,
            now,
            draw,
            f"{n} {counted} within {r.window.total_seconds() / 60:.0f} min "
            f"(threshold {r.threshold})",
        )

    def on_cooldown_over(self, s: CycleState, now: datetime) -> Move | None:
        """A turn of an excluded pool: at the end of its cool-down it is probed."""
        until = s.excluded_until
        if s.state is not PoolState.EXCLUDED or until is None or now < until:
            return None
        return Move(PoolState.PROBING, "cool-down over: probing with a canary")

    def on_probe_over(
        self, s: CycleState, probe_id: str, dirty: str, now: datetime, draw: Draw
    ) -> Move:
        """The probe's verdict: re-admitted when clean, else excluded again for longer."""
        if dirty:
            return self._exclude(s, now, draw, f"probe {probe_id}: {dirty}")
        return Move(
            PoolState.ADMITTED,
            f"probe {probe_id}: canary clean for {self.rules.probe.total_seconds():.0f} s",
        )

    def on_operator_exclude(
        self, operator: str, reason: str, until: datetime | None = None
    ) -> Move:
        """Excluded at once, until re-admitted or (with `until`) probed like the cycle's."""
        return Move(PoolState.EXCLUDED, reason, actor=operator, until=until)

    def on_operator_readmit(self, operator: str, reason: str) -> Move:
        """Re-admitted at once, strikes reset."""
        return Move(PoolState.ADMITTED, reason, actor=operator, strikes=0, unless_there=True)

    def on_adopt(
        self,
        s: CycleState,
        now: datetime,
        *,
        state: PoolState,
        strikes: int,
        until: datetime | None,
        set_by: str,
        reason: str,
    ) -> Move | None:
        """A fresh cycle takes over the pool's stored row (an exclusion outlives the workflow
        that made it). An admitted row keeps its strikes, forgiven a clean period from now;
        any other is excluded again, and a probe that was running is run again."""
        if state is PoolState.ADMITTED:
            if strikes:
                s.strikes = strikes
                s.admitted_since = now
            return None
        if until is None and set_by == CYCLE_SET_BY:
            until = now  # a cycle exclusion always ends in a probe
        return Move(
            PoolState.EXCLUDED,
            f"adopted: {reason}",
            set_by=set_by,
            strikes=strikes,
            until=until,
        )

    # -- state changes --------------------------------------------------------------------

    def apply(self, s: CycleState, move: Move, now: datetime) -> bool:
        """Make the move; False when there was nothing to do (`unless_there`)."""
        if move.unless_there and s.state is move.to:
            return False
        s.state = move.to
        s.reason = move.reason
        s.set_by = move.set_by or (CYCLE_SET_BY if move.actor == CYCLE_ACTOR else move.actor)
        if move.strikes is not None:
            s.strikes = move.strikes
        s.excluded_until = move.until if move.to is PoolState.EXCLUDED else None
        s.since = now
        if move.to is PoolState.ADMITTED:
            s.admitted_since = now
            s.counted_since = now  # the clean probe answered every notice before it
        return True

    def forgive(self, s: CycleState, _: Forgive) -> None:
        s.strikes = 0

    # -- reads ----------------------------------------------------------------------------

    def in_window(self, s: CycleState, now: datetime) -> int:
        """Notices that still count (since the last re-admission, within the window)."""
        return policy.count_in_window(s.notices, now, self.rules.window, s.counted_since)

    def reclaim_events(
        self, s: CycleState, now: datetime, *, burst_counting: bool = True
    ) -> tuple[int, str]:
        """What the threshold is held against, and what it counted."""
        r = self.rules
        if not burst_counting:
            return self.in_window(s, now), "reclaim notices"
        n = policy.count_bursts(s.notices, now, r.window, s.counted_since, r.burst_merge)
        if not r.burst_merge:
            return n, "reclaim notices"
        merge = r.burst_merge.total_seconds()
        return n, f"reclaim events (notices within {merge:.0f} s count once)"

    def cooldown(self, strikes: int, draw: float) -> timedelta:
        r = self.rules
        return policy.cooldown(
            strikes, base=r.base_cooldown, cap=r.max_cooldown, jitter=r.jitter, draw=draw
        )

    def _exclude(self, s: CycleState, now: datetime, draw: Draw, reason: str) -> Move:
        strikes = s.strikes + 1
        return Move(
            PoolState.EXCLUDED,
            reason,
            strikes=strikes,
            until=now + self.cooldown(strikes, draw(strikes)),
        )
