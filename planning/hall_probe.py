"""The floor keeper's hall-loss verdict over probes: pure, shared by the product's keeper
(workflows.floor.plan.judge) and the estate simulator's (estate.halls).

A probe reads, per hall, the floor's ACTIVE instances there (the keeper's own record),
how many of them the provider reports ERROR or does not know, and whether the provider
reports capacity of the floor's shape in the hall. Rule, with hysteresis:

- a hall not held lost is lost when >= ``lost_fraction`` of its floor instances are
  unhealthy on ``lost_probes`` probes in a row (a single bad answer is not a loss; a hall
  without floor instances is never judged lost);
- a *detected* loss lifts after ``clean_probes`` clean probes in a row (no unhealthy
  instance left there and the provider answering); an operator's loss is lifted only by an
  operator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


class HallReading(Protocol):
    """One hall in one probe (activities.floor.models.HallProbe has these fields)."""

    @property
    def instances(self) -> int: ...

    @property
    def unhealthy(self) -> int: ...

    @property
    def answering(self) -> bool: ...


@dataclass(frozen=True)
class ProbeRules:
    lost_fraction: float = 0.5
    lost_probes: int = 2
    clean_probes: int = 3


@dataclass
class HallVerdict:
    lost: dict[str, str] = field(default_factory=dict)  # hall -> why it is now lost
    restored: dict[str, str] = field(default_factory=dict)  # hall -> why it is back
    bad: dict[str, int] = field(default_factory=dict)  # hall -> bad probes in a row
    clean: dict[str, int] = field(default_factory=dict)  # lost hall -> clean probes in a row


def judge_halls(
    readings: Mapping[str, HallReading],
    lost: Mapping[str, bool],
    bad: Mapping[str, int],
    clean: Mapping[str, int],
    rules: ProbeRules,
) -> HallVerdict:
    """One probe's verdict. ``lost``: the halls held lost now, each True when the loss was
    detected by probes (probes may lift it), False when an operator declared it."""
    v = HallVerdict(bad=dict(bad), clean=dict(clean))
    for hall, p in sorted(readings.items()):
        detected = lost.get(hall)
        if detected is None:
            v.clean.pop(hall, None)
            unhealthy = p.instances > 0 and p.unhealthy >= rules.lost_fraction * p.instances
            v.bad[hall] = v.bad.get(hall, 0) + 1 if unhealthy else 0
            if v.bad[hall] >= rules.lost_probes:
                v.lost[hall] = (
                    f"{p.unhealthy} of {p.instances} floor instances in hall {hall} ERROR or "
                    f"gone on {v.bad[hall]} probes in a row"
                )
                v.bad[hall] = 0
            continue
        v.bad.pop(hall, None)
        if not detected:
            continue  # an operator's loss is lifted by an operator only
        ok = p.answering and p.unhealthy == 0
        v.clean[hall] = v.clean.get(hall, 0) + 1 if ok else 0
        if v.clean[hall] >= rules.clean_probes:
            v.restored[hall] = f"hall {hall} answered cleanly on {v.clean[hall]} probes in a row"
            v.clean.pop(hall)
    return v
