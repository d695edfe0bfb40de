"""Headroom: ready instances a contract holds beyond its demand, so a burst starts without a
boot (Karpenter CapacityBuffers, cluster-autoscaler's CapacityBuffer, Ocean headroom).

A contract's `headroom_units` is held at all times; each of its `headroom_schedules`
replaces it while its window is open (the same cron + duration shape as a disruption
budget's schedule, contracts/disruption.py), so an operator can hold more cover in
business hours and none at night. Several windows open at once: the largest wins.

Part of the contract layer: pure, no control plane.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from contracts.disruption import MAX_WINDOW_MINUTES, CronText, window_open_at

#: Most headroom schedules one contract may carry.
MAX_HEADROOM_SCHEDULES = 20


class HeadroomSchedule(BaseModel):
    """`units` of headroom in place of the contract's `headroom_units` while the window that
    opens when `schedule` fires (UTC) stays open, `duration_minutes` long."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    schedule: CronText
    duration_minutes: int = Field(gt=0, le=MAX_WINDOW_MINUTES)
    units: int = Field(ge=0, le=100_000)

    def open_at(self, now: datetime) -> bool:
        return window_open_at(self.schedule, self.duration_minutes, now)


class _HasHeadroom(Protocol):
    @property
    def headroom_units(self) -> int: ...

    @property
    def headroom_schedules(self) -> Sequence[HeadroomSchedule]: ...


def headroom_at(contract: _HasHeadroom, now: datetime) -> tuple[int, str]:
    """The headroom units the contract asks for at `now`, and why (which setting)."""
    open_ = [s for s in contract.headroom_schedules if s.open_at(now)]
    if not open_:
        if contract.headroom_units == 0:
            return 0, "no headroom"
        return contract.headroom_units, f"headroom_units {contract.headroom_units}"
    best = max(open_, key=lambda s: s.units)
    return best.units, (
        f"headroom schedule {best.schedule!r} ({best.duration_minutes} min) open: "
        f"{best.units} units in place of headroom_units {contract.headroom_units}"
    )
