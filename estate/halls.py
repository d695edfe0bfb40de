"""Hall loss detected, not read: the floor keeper's probes in the simulator, judged by the
product's own rule (planning.hall_probe.judge_halls, which the FloorKeeperWorkflow runs).

Every ``floor_probe_seconds`` (15 s: four probes a minute) a probe reads, for each hall of
the floor's shape, what the product's ``probe_halls`` activity reads:

- ``instances``: the floor instances the keeper believes it holds there (its own record);
- ``unhealthy``: of those, the ones the provider reports ERROR or does not know: an
  instance gone in a hall loss reads gone, unless the answer is stale (chance
  ``probe_stale``: a miss, detection later); during a provider glitch
  (``probe_glitches_per_hall_day``, 10-90 s each) a healthy instance reads ERROR with
  chance 0.7 (a false alarm when it lasts over two probes);
- ``answering``: the hall is up and not glitching (a lifted loss needs it).

A probe with no answer (chance ``probe_lost``) gives no verdict, as the workflow does when
the activity fails. Glitches are the environment's, the same for every policy (one seeded
stream per region); the per-probe draws are the watch's own.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from estate.config import EstateConfig
from planning.hall_probe import judge_halls

#: A glitching provider answers ERROR for a healthy instance with this chance.
GLITCH_ERROR = 0.7


@dataclass(frozen=True)
class Reading:
    instances: int
    unhealthy: int
    answering: bool


@dataclass
class Detection:
    hall: str
    minute: int
    lost: bool  # True: judged lost; False: judged back
    true_loss: bool  # the hall was in fact down then


def glitches(halls: Sequence[str], cfg: EstateConfig, key: str) -> dict[str, list[tuple[int, int]]]:
    """Per hall: (start, end) seconds of provider glitches over the horizon."""
    rng = random.Random(f"{key}:glitches")
    out: dict[str, list[tuple[int, int]]] = {}
    rate = cfg.probe_glitches_per_hall_day / 86_400.0
    horizon = cfg.minutes * 60
    for hall in sorted(halls):
        spans: list[tuple[int, int]] = []
        t = rng.expovariate(rate) if rate > 0 else float(horizon)
        while t < horizon:
            start = int(t)
            spans.append((start, start + rng.randint(10, 90)))
            t += rng.expovariate(rate)
        out[hall] = spans
    return out


@dataclass
class HallWatch:
    """One floor keeper's probes and verdicts (its lost halls, streaks, detections)."""

    halls: tuple[str, ...]
    cfg: EstateConfig
    glitch: dict[str, list[tuple[int, int]]]
    rng: random.Random
    lost: dict[str, int] = field(default_factory=dict)  # hall -> minute judged lost
    bad: dict[str, int] = field(default_factory=dict)
    clean: dict[str, int] = field(default_factory=dict)
    detections: list[Detection] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rules = self.cfg.probe_rules()
        self.every = self.cfg.floor_probe_seconds
        self.glitch_minutes: dict[int, set[str]] = {}
        for hall, spans in self.glitch.items():
            for a, b in spans:
                for m in range(a // 60, b // 60 + 1):
                    self.glitch_minutes.setdefault(m, set()).add(hall)

    def glitching(self, hall: str, second: int) -> bool:
        return any(a <= second < b for a, b in self.glitch.get(hall, ()))

    def minute(
        self, m: int, believed: Mapping[str, int], gone: Mapping[str, int], down: set[str]
    ) -> tuple[list[str], list[str]]:
        """This minute's probes: (halls newly judged lost, halls newly judged back).
        ``believed``: floor instances the keeper holds per hall by its record; ``gone``: of
        those, the ones no longer there; ``down``: halls in fact lost now."""
        noisy = self.glitch_minutes.get(m, set())
        quiet = not (self.lost or noisy or any(self.bad.values()) or any(gone.values()))
        if quiet and not down & set(self.halls):
            return [], []  # every probe this minute reads clean: no verdict changes
        newly_lost: list[str] = []
        newly_back: list[str] = []
        for second in range(m * 60, m * 60 + 60, self.every):
            if self.rng.random() < self.cfg.probe_lost:
                continue  # the probe failed: no verdict
            readings: dict[str, Reading] = {}
            for hall in self.halls:
                n = believed.get(hall, 0)
                dead = min(n, gone.get(hall, 0))
                glitch = hall in noisy and self.glitching(hall, second)
                unhealthy = sum(self.rng.random() >= self.cfg.probe_stale for _ in range(dead))
                if glitch:
                    unhealthy += sum(self.rng.random() < GLITCH_ERROR for _ in range(n - dead))
                readings[hall] = Reading(n, unhealthy, hall not in down and not glitch)
            v = judge_halls(readings, dict.fromkeys(self.lost, True), self.bad, self.clean,
                            self.rules)  # fmt: skip
            self.bad, self.clean = v.bad, v.clean
            for hall in v.lost:
                self.lost[hall] = m
                newly_lost.append(hall)
                self.detections.append(Detection(hall, m, True, hall in down))
            for hall in v.restored:
                self.lost.pop(hall, None)
                newly_back.append(hall)
                self.detections.append(Detection(hall, m, False, hall in down))
        return newly_lost, newly_back


def watch(
    halls: Sequence[str], region_halls: Sequence[str], cfg: EstateConfig, region: str, tenant: str
) -> HallWatch:
    """A keeper's watch over ``halls``; the glitches are the region's (every policy sees
    the same)."""
    key = f"estate:{cfg.seed}:{region}"
    return HallWatch(
        halls=tuple(sorted(halls)),
        cfg=cfg,
        glitch=glitches(region_halls, cfg, key),
        rng=random.Random(f"{key}:{tenant}:probes"),
    )
