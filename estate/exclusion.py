"""The pool exclusion cycle in simulated time, on the workflow's own arithmetic
(planning.exclusion_policy): notices in a sliding window, exclusion past the threshold, a
jittered doubling cool-down, a one-instance canary probe, strikes forgiven after a clean
day. Every state change goes on the pool's timeline."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from estate.config import EstateConfig
from planning import exclusion_policy as policy

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def at(minute: int) -> datetime:
    return EPOCH + timedelta(minutes=minute)


@dataclass
class PoolCycle:
    state: str = "admitted"  # admitted | excluded | probing
    strikes: int = 0
    notices: dict[str, datetime] = field(default_factory=dict)
    counted_since: datetime | None = None
    admitted_since: datetime | None = None
    until: int = 0  # minute the cool-down (excluded) or the probe (probing) ends
    dirty: bool = False
    timeline: list[tuple[int, str]] = field(default_factory=list)  # (minute, new state)


class ExclusionCycle:
    def __init__(self, pools: int, cfg: EstateConfig, seed_key: str) -> None:
        self.cfg = cfg
        self.pools = [PoolCycle() for _ in range(pools)]
        self.seed_key = seed_key
        self.window = timedelta(minutes=cfg.exclusion_window_minutes)
        self.probes = 0

    def excluded(self) -> set[int]:
        return {i for i, p in enumerate(self.pools) if p.state != "admitted"}

    def notice(self, pool: int, instance_id: str, minute: int) -> None:
        c = self.pools[pool]
        now = at(minute)
        if c.state == "probing":
            c.dirty = True
            return
        if not policy.add_notice(c.notices, instance_id, now, now, self.window):
            return
        if c.state != "admitted":
            return
        count = policy.count_bursts(
            c.notices,
            now,
            self.window,
            c.counted_since,
            timedelta(minutes=self.cfg.burst_merge_minutes),
        )
        if policy.over_threshold(count, self.cfg.exclusion_threshold):
            self._exclude(pool, minute)

    def _exclude(self, pool: int, minute: int) -> None:
        c = self.pools[pool]
        c.strikes += 1
        draw = random.Random(f"{self.seed_key}:{pool}:{c.strikes}:{minute}").random()
        wait = policy.cooldown(
            c.strikes,
            base=timedelta(minutes=self.cfg.base_cooldown_minutes),
            cap=timedelta(minutes=self.cfg.max_cooldown_minutes),
            jitter=self.cfg.cooldown_jitter,
            draw=draw,
        )
        c.state = "excluded"
        c.until = minute + max(1, round(wait.total_seconds() / 60))
        c.admitted_since = None
        c.timeline.append((minute, "excluded"))

    def tick(self, minute: int) -> list[int]:
        """Advance cool-downs and probes; returns the pools whose canary starts now."""
        now = at(minute)
        started = []
        for i, c in enumerate(self.pools):
            if c.state == "excluded" and minute >= c.until:
                c.state, c.until, c.dirty = "probing", minute + self.cfg.probe_minutes, False
                c.timeline.append((minute, "probing"))
                started.append(i)
                self.probes += 1
            elif c.state == "probing" and minute >= c.until:
                if c.dirty:
                    self._exclude(i, minute)
                else:
                    c.state = "admitted"
                    c.counted_since = c.admitted_since = now
                    c.notices = policy.prune(c.notices, now, self.window)
                    c.timeline.append((minute, "admitted"))
            elif c.state == "admitted" and policy.strikes_forgiven(
                c.strikes, c.admitted_since, now, timedelta(minutes=self.cfg.strike_reset_minutes)
            ):
                c.strikes = 0
        return started

    def excluded_minutes(self, pool: int, end: int) -> int:
        total, since = 0, None
        for minute, state in self.pools[pool].timeline:
            if state != "admitted" and since is None:
                since = minute
            elif state == "admitted" and since is not None:
                total += minute - since
                since = None
        return total + (end - since if since is not None else 0)
