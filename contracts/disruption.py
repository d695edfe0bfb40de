"""Disruption budgets: how much SCO itself may disrupt of a contract at once, and when.

A *voluntary* disruption is one SCO chooses (consolidation, drift, return from fallback,
expiry); hall-loss rebuilds and provider reclaims are never voluntary and never limited
here. A contract's `disruption` block holds budgets (at most N instances or P % of its
instances at once, per reason, optionally only in a cron window), blackout windows (no
voluntary disruption at all) and an optional maximum instance age (expiry).

Part of the contract layer: pure, no control plane. The cron reader is the five-field
Vixie form (minute hour day-of-month month day-of-week; `*`, lists, ranges, steps), times
in UTC; when both day fields are restricted a day matching either fires, as in cron(8).
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Annotated

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class DisruptionReason(enum.StrEnum):
    """Why SCO would disrupt an instance. The first four are voluntary (budgeted)."""

    CONSOLIDATION = "consolidation"
    DRIFT = "drift"
    RETURN_FROM_FALLBACK = "return-from-fallback"
    EXPIRY = "expiry"
    # Never voluntary, never blocked: listed so callers can pass any reason to the budget.
    HALL_LOSS = "hall-loss"
    RECLAIM = "reclaim"

    @property
    def voluntary(self) -> bool:
        return self not in (DisruptionReason.HALL_LOSS, DisruptionReason.RECLAIM)


VOLUNTARY_REASONS: tuple[DisruptionReason, ...] = tuple(r for r in DisruptionReason if r.voluntary)

#: Longest budget window or blackout a cron schedule may open: one week.
MAX_WINDOW_MINUTES = 7 * 24 * 60
#: Longest maximum instance age: a year.
MAX_AGE_HOURS = 366 * 24

# (low, high) of each cron field, in order.
_CRON_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),  # 0 and 7 are Sunday
)


class CronError(ValueError):
    pass


@dataclass(frozen=True)
class Cron:
    """A parsed five-field cron expression (UTC)."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday .. 6
    days_restricted: bool
    weekdays_restricted: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        return _parse_cached(text)

    @classmethod
    def _parse(cls, text: str) -> Cron:
        parts = text.split()
        if len(parts) != 5:
            raise CronError(f"cron {text!r}: needs 5 fields (minute hour dom month dow)")
        sets = [
            _cron_field(part, name, low, high)
            for part, (name, low, high) in zip(parts, _CRON_FIELDS, strict=True)
        ]
        weekdays = frozenset(d % 7 for d in sets[4])
        return cls(
            minutes=sets[0],
            hours=sets[1],
            days=sets[2],
            months=sets[3],
            weekdays=weekdays,
            days_restricted=parts[2] != "*",
            weekdays_restricted=parts[4] != "*",
        )

    def day_matches(self, day: datetime) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        dow = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return dom or dow
        return dom and dow

    def _latest_time(self, limit: tuple[int, int]) -> tuple[int, int] | None:
        """The latest (hour, minute) of the schedule at or before `limit` in one day."""
        for hour in sorted((h for h in self.hours if h <= limit[0]), reverse=True):
            top = limit[1] if hour == limit[0] else 59
            minute = max((m for m in self.minutes if m <= top), default=None)
            if minute is not None:
                return hour, minute
        return None

    def last_fire_at_or_before(self, now: datetime, lookback: timedelta) -> datetime | None:
        """The latest time this schedule fired at or before `now`, if within `lookback`."""
        now = now.astimezone(UTC).replace(second=0, microsecond=0)
        earliest = now - lookback
        day = now.replace(hour=0, minute=0)
        while day >= earliest.replace(hour=0, minute=0):
            if self.day_matches(day):
                limit = (now.hour, now.minute) if day.date() == now.date() else (23, 59)
                best = self._latest_time(limit)
                if best is not None:
                    fired = day.replace(hour=best[0], minute=best[1])
                    return fired if fired >= earliest else None
            day -= timedelta(days=1)
        return None


@functools.lru_cache(maxsize=256)
def _parse_cached(text: str) -> Cron:
    # Budgets are evaluated every controller tick and every compile samples a week: parse
    # each expression once. Errors are not cached (lru_cache does not cache exceptions).
    return Cron._parse(text)


def _cron_field(part: str, name: str, low: int, high: int) -> frozenset[int]:
    out: set[int] = set()
    for item in part.split(","):
        body, _, step_text = item.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"cron {name} {item!r}: step must be a positive number")
            step = int(step_text)
        if body == "*":
            start, end = low, high
        elif "-" in body:
            a, _, b = body.partition("-")
            if not (a.isdigit() and b.isdigit()):
                raise CronError(f"cron {name} {item!r}: not a range of numbers")
            start, end = int(a), int(b)
        elif body.isdigit():
            start = int(body)
            end = high if step_text else start
        else:
            raise CronError(f"cron {name} {item!r}: not a number, range, list or *")
        if not (low <= start <= end <= high):
            raise CronError(f"cron {name} {item!r}: outside {low}-{high} or reversed")
        out.update(range(start, end + 1, step))
    return frozenset(out)


def _parsed_cron(value: str) -> str:
    Cron.parse(value)  # CronError is a ValueError: one finding naming the field
    return value


#: A schedule as written in a contract: checked to parse wherever it appears.
CronText = Annotated[
    str, StringConstraints(min_length=1, max_length=100), AfterValidator(_parsed_cron)
]


class _Window(_Strict):
    """A window that opens when `schedule` fires and stays open `duration_minutes`."""

    schedule: CronText | None = None
    duration_minutes: int | None = Field(default=None, gt=0, le=MAX_WINDOW_MINUTES)

    @model_validator(mode="after")
    def _schedule_with_duration(self) -> _Window:
        if (self.schedule is None) != (self.duration_minutes is None):
            raise ValueError("schedule and duration_minutes go together")
        return self

    def open_at(self, now: datetime) -> bool:
        if self.schedule is None or self.duration_minutes is None:
            return True  # no schedule: always
        lookback = timedelta(minutes=self.duration_minutes)
        fired = Cron.parse(self.schedule).last_fire_at_or_before(now, lookback)
        return fired is not None and now.astimezone(UTC) < fired + lookback


def window_open_at(schedule: str, duration_minutes: int, now: datetime) -> bool:
    """Whether the window `schedule` opens for `duration_minutes` is open at `now` (for
    other cron windows of the contract, such as headroom schedules)."""
    return _Window(schedule=schedule, duration_minutes=duration_minutes).open_at(now)


class Budget(_Strict):
    """At most `max_instances` or `max_percent` % of the contract's instances (rounded up)
    voluntarily disrupted at once for `reasons`; with a schedule, only while its window is
    open (outside it this budget does not apply)."""

    reasons: list[DisruptionReason] = Field(default_factory=lambda: list(VOLUNTARY_REASONS))
    max_instances: int | None = Field(default=None, ge=0, le=100_000)
    max_percent: float | None = Field(default=None, ge=0, le=100)
    schedule: CronText | None = None
    duration_minutes: int | None = Field(default=None, gt=0, le=MAX_WINDOW_MINUTES)

    @field_validator("reasons")
    @classmethod
    def _voluntary_once(cls, value: list[DisruptionReason]) -> list[DisruptionReason]:
        if not value:
            raise ValueError("name at least one reason")
        if len(set(value)) != len(value):
            raise ValueError("a reason is listed twice")
        for r in value:
            if not r.voluntary:
                raise ValueError(f"{r.value} is never voluntary and cannot be budgeted")
        return value

    @model_validator(mode="after")
    def _one_limit(self) -> Budget:
        if (self.max_instances is None) == (self.max_percent is None):
            raise ValueError("give exactly one of max_instances and max_percent")
        if (self.schedule is None) != (self.duration_minutes is None):
            raise ValueError("schedule and duration_minutes go together")
        return self

    def active_at(self, now: datetime) -> bool:
        return _Window(schedule=self.schedule, duration_minutes=self.duration_minutes).open_at(now)

    def limit(self, instances: int) -> int:
        if self.max_instances is not None:
            return self.max_instances
        pct = self.max_percent or 0.0
        # Rounded up (Karpenter's rule), so 10 % of 3 instances is 1, never 0; 0 % is 0.
        # The percentage as written (its shortest decimal), so 10 % of 30 is exactly 3.
        return math.ceil(Fraction(str(pct)) * instances / 100)


class Blackout(_Strict):
    """No voluntary disruption while open: a cron window, or a fixed [start, end)."""

    schedule: CronText | None = None
    duration_minutes: int | None = Field(default=None, gt=0, le=MAX_WINDOW_MINUTES)
    start: AwareDatetime | None = None
    end: AwareDatetime | None = None

    @model_validator(mode="after")
    def _one_form(self) -> Blackout:
        cron = self.schedule is not None or self.duration_minutes is not None
        fixed = self.start is not None or self.end is not None
        if cron == fixed:
            raise ValueError("give either schedule + duration_minutes or start + end")
        if cron and (self.schedule is None or self.duration_minutes is None):
            raise ValueError("schedule and duration_minutes go together")
        if fixed:
            if self.start is None or self.end is None:
                raise ValueError("start and end go together")
            if self.end <= self.start:
                raise ValueError("end must be after start")
        return self

    def open_at(self, now: datetime) -> bool:
        if self.start is not None and self.end is not None:
            return self.start <= now < self.end
        return _Window(schedule=self.schedule, duration_minutes=self.duration_minutes).open_at(now)


#: Without a `disruption` block (or without budgets in it): 10 % of a contract's
#: instances at once, for every voluntary reason.
DEFAULT_BUDGETS: tuple[Budget, ...] = (Budget(max_percent=10),)


class Disruption(_Strict):
    budgets: list[Budget] = Field(default_factory=lambda: list(DEFAULT_BUDGETS), max_length=50)
    blackouts: list[Blackout] = Field(default=[], max_length=50)
    # Instances older than this are replaced (reason expiry), within the budgets.
    max_instance_age_hours: int | None = Field(default=None, gt=0, le=MAX_AGE_HOURS)
