"""The pool exclusion cycle's state machine (planning.exclusion_cycle), without Temporal:
each event's decision as a table, the draw asked for only when a cool-down is decided (the
workflow's random sequence, so its replay, depends on it), and a whole cycle walked."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from planning.exclusion_cycle import (
    CycleRules,
    ExclusionCycle,
    Forgive,
    Move,
    PoolState,
    ProbeWatch,
)
from workflows.exclusion.models import ExclusionCarry, ExclusionConfig

T0 = datetime(2030, 1, 1, tzinfo=UTC)
MIN = timedelta(minutes=1)
RULES = ExclusionConfig(burst_merge_seconds=0).cycle_rules()
A, E, P = PoolState.ADMITTED, PoolState.EXCLUDED, PoolState.PROBING


@dataclass
class Draws:
    """A cool-down draw that counts how often it is asked for."""

    value: float = 0.5
    asked: list[int] = field(default_factory=list)

    def __call__(self, strikes: int) -> float:
        self.asked.append(strikes)
        return self.value


def pool(state: PoolState = A, strikes: int = 0, **kw: object) -> ExclusionCarry:
    return ExclusionCarry(state=state, strikes=strikes, **kw)


def noticed(cycle: ExclusionCycle, s: ExclusionCarry, *minutes: int) -> None:
    for m in minutes:
        assert cycle.on_notice(s, f"i-{m}", T0 + m * MIN, T0 + m * MIN)


def test_the_carried_model_is_the_cycles_state() -> None:
    # The workflow's carry satisfies the machine's CycleState (mypy checks it; here: at run).
    cycle, s = ExclusionCycle(RULES), pool()
    move = Move(E, "x", strikes=2, until=T0 + MIN)
    assert cycle.apply(s, move, T0)
    assert (s.state, s.strikes, s.excluded_until, s.since, s.set_by) == (
        E,
        2,
        T0 + MIN,
        T0,
        "cycle",
    )


@pytest.mark.parametrize(
    ("state", "probe_since", "at_minute", "dirty"),
    [
        (P, 0, 1, "reclaim notice for i-x during the probe"),
        (P, 2, 1, ""),  # from before the probe started
        (P, None, 1, ""),  # probing, but the probe is not watched yet
        (E, 0, 1, ""),
        (A, 0, 1, ""),
    ],
)
def test_a_notice_dirties_only_a_running_probe(
    state: PoolState, probe_since: int | None, at_minute: int, dirty: str
) -> None:
    cycle, s = ExclusionCycle(RULES), pool(state)
    watch = None if probe_since is None else ProbeWatch(T0 + probe_since * MIN)
    now = T0 + 3 * MIN
    assert cycle.on_notice(s, "i-x", T0 + at_minute * MIN, now, watch)
    assert (watch.dirty if watch else "") == dirty
    assert not cycle.on_notice(s, "i-x", T0 + at_minute * MIN, now, watch)  # deduplicated


def test_the_first_dirty_reason_stays() -> None:
    cycle, s, watch = ExclusionCycle(RULES), pool(P), ProbeWatch(T0)
    noticed(cycle, s, 1)
    cycle.on_notice(s, "i-2", T0 + 2 * MIN, T0 + 2 * MIN, watch)
    cycle.on_notice(s, "i-3", T0 + 3 * MIN, T0 + 3 * MIN, watch)
    assert watch.dirty == "reclaim notice for i-2 during the probe"


@pytest.mark.parametrize(
    ("state", "strikes", "minutes", "burst_counting", "merge", "to", "reason"),
    [
        (A, 0, (0, 10), True, 0, None, ""),
        (A, 0, (0, 10, 20), True, 0, E, "3 reclaim notices within 60 min (threshold 3)"),
        (A, 2, (0, 10, 20), True, 0, E, "3 reclaim notices within 60 min"),
        (E, 1, (0, 10, 20), True, 0, None, ""),  # already out: nothing to count for
        (A, 0, (0, 1, 2), True, 180, None, ""),  # one co-reclaim burst
        (A, 0, (0, 1, 2), False, 180, E, "3 reclaim notices"),  # before burst counting
        (A, 0, (0, 4, 8), True, 180, E, "3 reclaim events (notices within 180 s count once)"),
    ],
)
def test_counting_against_the_threshold(
    state: PoolState,
    strikes: int,
    minutes: tuple[int, ...],
    burst_counting: bool,
    merge: int,
    to: PoolState | None,
    reason: str,
) -> None:
    rules = CycleRules(**{**vars(RULES), "burst_merge": timedelta(seconds=merge)})
    cycle, s, draw = ExclusionCycle(rules), pool(state, strikes), Draws()
    noticed(cycle, s, *minutes)
    now = T0 + 30 * MIN
    move = cycle.on_count(s, now, draw, burst_counting=burst_counting)
    if to is None:
        assert move is None and draw.asked == []
        return
    assert move is not None and move.to is to and reason in move.reason
    assert move.strikes == strikes + 1 and draw.asked == [strikes + 1]
    assert move.until == now + cycle.cooldown(strikes + 1, 0.5)


def test_notices_before_the_last_readmission_do_not_count() -> None:
    cycle, s = ExclusionCycle(RULES), pool(P)
    noticed(cycle, s, 0, 1, 2)
    assert cycle.apply(s, Move(A, "probe clean"), T0 + 5 * MIN)
    assert cycle.in_window(s, T0 + 6 * MIN) == 0
    assert cycle.on_count(s, T0 + 6 * MIN, Draws()) is None


@pytest.mark.parametrize(
    ("state", "until_minute", "now_minute", "to"),
    [
        (E, 15, 14, None),
        (E, 15, 15, P),
        (E, 15, 40, P),
        (E, None, 10_000, None),  # an operator's exclusion until re-admitted
        (P, 15, 40, None),
        (A, None, 40, None),
    ],
)
def test_the_cool_down_ends_in_a_probe(
    state: PoolState, until_minute: int | None, now_minute: int, to: PoolState | None
) -> None:
    until = None if until_minute is None else T0 + until_minute * MIN
    move = ExclusionCycle(RULES).on_cooldown_over(
        pool(state, 1, excluded_until=until), T0 + now_minute * MIN
    )
    assert (move.to if move else None) is to


def test_the_probes_verdict() -> None:
    cycle, s, draw = ExclusionCycle(RULES), pool(P, 2), Draws()
    clean = cycle.on_probe_over(s, "probe-x", "", T0, draw)
    assert clean == Move(A, "probe probe-x: canary clean for 600 s") and draw.asked == []
    dirty = cycle.on_probe_over(s, "probe-x", "canary hit a capacity error", T0, draw)
    assert dirty.to is E and dirty.strikes == 3 and draw.asked == [3]
    assert dirty.reason == "probe probe-x: canary hit a capacity error"
    assert dirty.until == T0 + cycle.cooldown(3, 0.5) == T0 + 60 * MIN  # 15 min doubled twice


@pytest.mark.parametrize(
    ("strikes", "admitted_hours", "forgiven"),
    [(0, 48, False), (2, 23, False), (2, 24, True), (1, 30, True)],
)
def test_strikes_are_forgiven_after_a_clean_day(
    strikes: int, admitted_hours: int, forgiven: bool
) -> None:
    cycle = ExclusionCycle(RULES)
    s = pool(A, strikes, admitted_since=T0)
    decision = cycle.on_check(s, T0 + timedelta(hours=admitted_hours))
    assert (decision is not None) is forgiven
    if decision is not None:
        assert decision == Forgive(f"admitted 24 h without exclusion: {strikes} strike(s) forgiven")
        cycle.forgive(s, decision)
        assert s.strikes == 0 and s.state is A
    assert cycle.on_check(pool(E, 2, admitted_since=T0), T0 + timedelta(days=3)) is None


def test_operators_override() -> None:
    cycle, s = ExclusionCycle(RULES), pool(A, 2)
    out = cycle.on_operator_exclude("alice", "maintenance")
    assert cycle.apply(s, out, T0)
    assert (s.state, s.strikes, s.set_by, s.excluded_until) == (E, 2, "alice", None)
    back = cycle.on_operator_readmit("bob", "done")
    assert cycle.apply(s, back, T0 + MIN)
    assert (s.state, s.strikes, s.set_by, s.counted_since) == (A, 0, "bob", T0 + MIN)
    assert not cycle.apply(s, back, T0 + 2 * MIN)  # the second of two at once: done already
    assert s.since == T0 + MIN


ADOPTED = "adopted: r"


@pytest.mark.parametrize(
    ("state", "strikes", "until", "set_by", "move", "kept"),
    [
        (A, 0, None, "cycle", None, (0, None)),
        (A, 2, None, "cycle", None, (2, T0)),  # forgiven a clean day from now
        (
            E,
            1,
            T0 + MIN,
            "cycle",
            Move(E, ADOPTED, set_by="cycle", strikes=1, until=T0 + MIN),
            None,
        ),
        (P, 1, None, "cycle", Move(E, ADOPTED, set_by="cycle", strikes=1, until=T0), None),
        (E, 0, None, "alice", Move(E, ADOPTED, set_by="alice", strikes=0), None),
    ],
)
def test_a_fresh_cycle_adopts_the_stored_row(
    state: PoolState,
    strikes: int,
    until: datetime | None,
    set_by: str,
    move: Move | None,
    kept: tuple[int, datetime | None] | None,
) -> None:
    s = pool()
    got = ExclusionCycle(RULES).on_adopt(
        s, T0, state=state, strikes=strikes, until=until, set_by=set_by, reason="r"
    )
    assert got == move
    if kept is not None:
        assert (s.strikes, s.admitted_since) == kept


def test_a_whole_cycle() -> None:
    """Three notices, a cool-down, a dirty probe, a longer cool-down, a clean probe."""
    cycle, s, draw = ExclusionCycle(RULES), pool(), Draws()
    noticed(cycle, s, 0, 5)
    assert cycle.on_count(s, T0 + 5 * MIN, draw) is None
    noticed(cycle, s, 10)
    states = []

    def do(move: Move | None, minute: int) -> None:
        assert move is not None and cycle.apply(s, move, T0 + minute * MIN)
        states.append((minute, s.state.value, s.strikes))

    do(cycle.on_count(s, T0 + 10 * MIN, draw), 10)  # out for 15 min
    assert cycle.on_cooldown_over(s, T0 + 24 * MIN) is None
    do(cycle.on_cooldown_over(s, T0 + 25 * MIN), 25)
    watch = ProbeWatch(T0 + 25 * MIN)
    cycle.on_notice(s, "i-canary", T0 + 30 * MIN, T0 + 30 * MIN, watch)
    do(cycle.on_probe_over(s, "p1", watch.dirty, T0 + 35 * MIN, draw), 35)  # out for 30
    do(cycle.on_cooldown_over(s, T0 + 65 * MIN), 65)
    do(cycle.on_probe_over(s, "p2", ProbeWatch(T0 + 65 * MIN).dirty, T0 + 75 * MIN, draw), 75)
    assert states == [
        (10, "excluded", 1),
        (25, "probing", 1),
        (35, "excluded", 2),
        (65, "probing", 2),
        (75, "admitted", 2),
    ]
    assert draw.asked == [1, 2]
    assert cycle.in_window(s, T0 + 76 * MIN) == 0
