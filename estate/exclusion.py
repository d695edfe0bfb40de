"""The pool exclusion cycle in simulated time: the product's own state machine
(planning.exclusion_cycle, the one PoolExclusionWorkflow runs) driven for every pool of a
region. Every decision is the machine's; what is the simulator's own is what the workflow
does with timers and activities: the clock (whole minutes: a cool-down ends at the first
simulated minute at or after its end), the cool-down's seeded draw, a probe that lasts
exactly the probe time (its canary costs that long), and each pool's timeline."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from estate.config import EstateConfig
from planning import exclusion_policy as policy
from planning.exclusion_cycle import (
    CYCLE_SET_BY,
    Draw,
    ExclusionCycle,
    Move,
    PoolState,
    ProbeWatch,
)

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def at(minute: int) -> datetime:
    return EPOCH + timedelta(minutes=minute)


@dataclass
class PoolCycle:
    """One pool's cycle state (planning.exclusion_cycle.CycleState) and its timeline."""

    state: PoolState = PoolState.ADMITTED
    strikes: int = 0
    reason: str = ""
    set_by: str = CYCLE_SET_BY
    excluded_until: datetime | None = None
    since: datetime | None = None
    admitted_since: datetime | None = None
    counted_since: datetime | None = None
    notices: dict[str, datetime] = field(default_factory=dict)
    probe: ProbeWatch | None = None
    probe_ends: int = 0  # minute the probe's verdict is due
    timeline: list[tuple[int, str]] = field(default_factory=list)  # (minute, new state)


class PoolCycles:
    def __init__(self, pools: int, cfg: EstateConfig, seed_key: str) -> None:
        self.cycle = ExclusionCycle(cfg.exclusion_rules())
        self.pools = [PoolCycle() for _ in range(pools)]
        self.seed_key = seed_key
        self.probe_minutes = cfg.probe_minutes
        self.probes = 0

    def excluded(self) -> set[int]:
        return {i for i, p in enumerate(self.pools) if p.state is not PoolState.ADMITTED}

    def notice(self, pool: int, instance_id: str, minute: int) -> None:
        """A reclaim notice for an instance in the pool (the workflow's `reclaim_noticed`)."""
        c, now = self.pools[pool], at(minute)
        if self.cycle.on_notice(c, instance_id, now, now, c.probe):
            self._move(pool, self.cycle.on_count(c, now, self._draw(pool, minute)), minute)

    def canary_reclaimed(self, pool: int, minute: int) -> None:
        """The provider took back the pool's canary: its notice, if a probe is running."""
        if self.pools[pool].state is PoolState.PROBING:
            self.notice(pool, f"{minute}:{pool}:canary", minute)

    def tick(self, minute: int) -> list[int]:
        """A turn of every pool's cycle; returns the pools whose canary starts now."""
        now = at(minute)
        started = []
        for i, c in enumerate(self.pools):
            if c.state is PoolState.EXCLUDED:
                if self._move(i, self.cycle.on_cooldown_over(c, now), minute):
                    c.probe, c.probe_ends = ProbeWatch(since=now), minute + self.probe_minutes
                    started.append(i)
                    self.probes += 1
            elif c.state is PoolState.PROBING:
                if minute >= c.probe_ends and c.probe is not None:
                    dirty = c.probe.dirty
                    c.probe = None
                    verdict = self.cycle.on_probe_over(
                        c, f"{i}@{minute}", dirty, now, self._draw(i, minute)
                    )
                    self._move(i, verdict, minute)
            elif (forgive := self.cycle.on_check(c, now)) is not None:
                self.cycle.forgive(c, forgive)
        return started

    def _move(self, pool: int, move: Move | None, minute: int) -> bool:
        c = self.pools[pool]
        if move is None or not self.cycle.apply(c, move, at(minute)):
            return False
        c.timeline.append((minute, c.state.value))
        if c.state is PoolState.ADMITTED:
            # Memory only: notices outside the window never count again.
            c.notices = policy.prune(c.notices, at(minute), self.cycle.rules.window)
        return True

    def _draw(self, pool: int, minute: int) -> Draw:
        def draw(strikes: int) -> float:
            return random.Random(f"{self.seed_key}:{pool}:{strikes}:{minute}").random()

        return draw

    def excluded_minutes(self, pool: int, end: int) -> int:
        total, since = 0, None
        for minute, state in self.pools[pool].timeline:
            if state != PoolState.ADMITTED and since is None:
                since = minute
            elif state == PoolState.ADMITTED and since is not None:
                total += minute - since
                since = None
        return total + (end - since if since is not None else 0)
