"""The disruption budget (planning/disruption_budget.py): tables, then properties."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.disruption import (
    VOLUNTARY_REASONS,
    Blackout,
    Budget,
    Cron,
    Disruption,
    DisruptionReason,
)
from planning.disruption_budget import allowed_disruptions

R = DisruptionReason
# A Wednesday.
NOON = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def d(**kw: Any) -> Disruption:
    return Disruption.model_validate(kw, strict=False)


CASES: list[tuple[str, Disruption | None, R, datetime, int, dict[R, int], int | None]] = [
    ("default is 10 % rounded up", None, R.DRIFT, NOON, 25, {}, 3),
    ("default counts every voluntary reason", None, R.DRIFT, NOON, 25, {R.EXPIRY: 2}, 1),
    ("default, one instance still allows one", None, R.EXPIRY, NOON, 1, {}, 1),
    ("no instances, no percentage", None, R.DRIFT, NOON, 0, {}, 0),
    (
        "count budget",
        d(budgets=[{"max_instances": 2}]),
        R.CONSOLIDATION,
        NOON,
        50,
        {R.CONSOLIDATION: 1},
        1,
    ),
    (
        "in flight beyond the cap is 0, never negative",
        d(budgets=[{"max_instances": 1}]),
        R.DRIFT,
        NOON,
        50,
        {R.DRIFT: 4},
        0,
    ),
    (
        "a budget for other reasons does not apply",
        d(budgets=[{"reasons": ["drift"], "max_instances": 0}]),
        R.CONSOLIDATION,
        NOON,
        10,
        {},
        None,
    ),
    (
        "the tightest applying budget wins",
        d(budgets=[{"max_percent": 50}, {"reasons": ["drift"], "max_instances": 1}]),
        R.DRIFT,
        NOON,
        10,
        {},
        1,
    ),
    (
        "a budget counts only its reasons in flight",
        d(budgets=[{"reasons": ["drift"], "max_instances": 2}]),
        R.DRIFT,
        NOON,
        10,
        {R.CONSOLIDATION: 5, R.DRIFT: 1},
        1,
    ),
    (
        "scheduled budget inside its window",
        d(budgets=[{"max_instances": 0, "schedule": "0 9 * * 1-5", "duration_minutes": 480}]),
        R.DRIFT,
        NOON,
        10,
        {},
        0,
    ),
    (
        "scheduled budget outside its window does not apply",
        d(budgets=[{"max_instances": 0, "schedule": "0 9 * * 1-5", "duration_minutes": 60}]),
        R.DRIFT,
        NOON,
        10,
        {},
        None,
    ),
    (
        "a window crossing midnight is open the next morning",
        d(budgets=[{"max_instances": 0, "schedule": "0 22 * * *", "duration_minutes": 900}]),
        R.EXPIRY,
        NOON.replace(hour=6),
        10,
        {},
        0,
    ),
    (
        "cron blackout stops every voluntary reason",
        d(blackouts=[{"schedule": "0 11 * * 3", "duration_minutes": 120}]),
        R.RETURN_FROM_FALLBACK,
        NOON,
        10,
        {},
        0,
    ),
    (
        "fixed blackout, end excluded",
        d(blackouts=[{"start": "2026-12-02T08:00:00Z", "end": "2026-12-02T12:00:00Z"}]),
        R.CONSOLIDATION,
        NOON,
        10,
        {},
        1,
    ),
    (
        "a hall loss is never blocked, even in a blackout",
        d(blackouts=[{"schedule": "* * * * *", "duration_minutes": 10}]),
        R.HALL_LOSS,
        NOON,
        10,
        {},
        None,
    ),
    (
        "a reclaim is never blocked",
        d(budgets=[{"max_instances": 0}]),
        R.RECLAIM,
        NOON,
        10,
        {},
        None,
    ),
]


@pytest.mark.parametrize(
    ("disruption", "reason", "now", "instances", "in_flight", "allowed"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_allowed_disruptions(
    disruption: Disruption | None,
    reason: R,
    now: datetime,
    instances: int,
    in_flight: dict[R, int],
    allowed: int | None,
) -> None:
    verdict = allowed_disruptions(
        disruption, reason, now=now, instances=instances, in_flight=in_flight
    )
    assert verdict.allowed == allowed, verdict.why
    assert verdict.why


@pytest.mark.parametrize(
    ("expr", "now", "fired"),
    [
        ("*/15 * * * *", datetime(2026, 12, 2, 12, 14, tzinfo=UTC), (12, 0)),
        ("30 8-10 * * *", datetime(2026, 12, 2, 12, 0, tzinfo=UTC), (10, 30)),
        # dom or dow when both are restricted: the 1st (a Tuesday) fires by day of month.
        ("0 0 1 * 5", datetime(2026, 12, 1, 3, 0, tzinfo=UTC), (0, 0)),
        ("0 0 * * 0", datetime(2026, 12, 6, 1, 0, tzinfo=UTC), (0, 0)),  # a Sunday
        ("0 0 * * 7", datetime(2026, 12, 6, 1, 0, tzinfo=UTC), (0, 0)),  # 7 is Sunday too
    ],
)
def test_cron_last_fire(expr: str, now: datetime, fired: tuple[int, int]) -> None:
    got = Cron.parse(expr).last_fire_at_or_before(now, timedelta(hours=6))
    assert got is not None and (got.hour, got.minute) == fired and got.date() == now.date()


def test_cron_outside_lookback_is_none() -> None:
    assert Cron.parse("0 0 * * 6").last_fire_at_or_before(NOON, timedelta(hours=6)) is None


# --- properties ---------------------------------------------------------------------------

reasons = st.sampled_from(list(DisruptionReason))
voluntary = st.sampled_from(list(VOLUNTARY_REASONS))
times = st.datetimes(
    min_value=datetime(2026, 1, 1), max_value=datetime(2028, 1, 1), timezones=st.just(UTC)
)
crons = st.sampled_from(["* * * * *", "0 9 * * 1-5", "*/10 2-4 * * *", "0 0 1,15 * *"])


@st.composite
def budgets(draw: st.DrawFn) -> Budget:
    rs = draw(st.lists(voluntary, min_size=1, max_size=4, unique=True))
    kw: dict[str, Any] = {"reasons": rs}
    if draw(st.booleans()):
        kw["max_instances"] = draw(st.integers(0, 20))
    else:
        kw["max_percent"] = draw(st.floats(0, 100, allow_nan=False))
    if draw(st.booleans()):
        kw["schedule"] = draw(crons)
        kw["duration_minutes"] = draw(st.integers(1, 3000))
    return Budget.model_validate(kw)


@st.composite
def disruptions(draw: st.DrawFn) -> Disruption:
    blackouts = []
    if draw(st.booleans()):
        blackouts.append(
            Blackout(schedule=draw(crons), duration_minutes=draw(st.integers(1, 3000)))
        )
    return Disruption(budgets=draw(st.lists(budgets(), max_size=4)), blackouts=blackouts)


in_flights = st.dictionaries(voluntary, st.integers(0, 30))


@settings(max_examples=300, deadline=None)
@given(disruptions(), reasons, times, st.integers(0, 500), in_flights)
def test_involuntary_never_blocked_and_voluntary_bounded(
    disruption: Disruption, reason: R, now: datetime, instances: int, in_flight: dict[R, int]
) -> None:
    v = allowed_disruptions(disruption, reason, now=now, instances=instances, in_flight=in_flight)
    if not reason.voluntary:
        assert v.allowed is None
        return
    if any(b.open_at(now) for b in disruption.blackouts):
        assert v.allowed == 0
    if v.allowed is not None:
        # Never more than any applying budget leaves, so starting `allowed` keeps every cap.
        for b in disruption.budgets:
            if reason in b.reasons and b.active_at(now):
                busy = sum(in_flight.get(r, 0) for r in b.reasons)
                assert v.allowed + busy <= max(b.limit(instances), busy)


@settings(max_examples=300, deadline=None)
@given(disruptions(), voluntary, times, st.integers(0, 500), in_flights, voluntary)
def test_more_in_flight_never_allows_more(
    disruption: Disruption,
    reason: R,
    now: datetime,
    instances: int,
    in_flight: dict[R, int],
    extra: R,
) -> None:
    before = allowed_disruptions(
        disruption, reason, now=now, instances=instances, in_flight=in_flight
    )
    more = {**in_flight, extra: in_flight.get(extra, 0) + 1}
    after = allowed_disruptions(disruption, reason, now=now, instances=instances, in_flight=more)
    if before.allowed is None:
        assert after.allowed is None
    else:
        assert after.allowed is not None and after.allowed <= before.allowed


@settings(max_examples=200, deadline=None)
@given(budgets(), st.integers(0, 10_000))
def test_percent_limit_is_monotone_and_rounded_up(budget: Budget, instances: int) -> None:
    limit = budget.limit(instances)
    assert limit >= 0
    assert budget.limit(instances + 1) >= limit
    if budget.max_percent is not None:
        assert limit >= budget.max_percent * instances / 100 - 1e-9


@settings(max_examples=200, deadline=None)
@given(crons, times, st.integers(1, 3000))
def test_cron_window_matches_a_minute_scan(expr: str, now: datetime, minutes: int) -> None:
    now = now.replace(second=0, microsecond=0)
    cron = Cron.parse(expr)
    fired = cron.last_fire_at_or_before(now, timedelta(minutes=minutes))
    scan = None
    for back in range(minutes + 1):
        t = now - timedelta(minutes=back)
        if cron.day_matches(t) and t.hour in cron.hours and t.minute in cron.minutes:
            scan = t
            break
    assert fired == scan
