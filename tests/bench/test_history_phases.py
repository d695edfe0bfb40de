"""bench/history_phases.py: a history's steps, timed from the bench's own moment."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from bench.history_phases import condensed, steps_of

T0 = 1_800_000_000.0


def _event(event_id: int, at: float, kind: EventType.ValueType, **attrs: object) -> HistoryEvent:
    e = HistoryEvent(event_id=event_id, event_type=kind)
    e.event_time.FromNanoseconds(int((T0 + at) * 1e9))
    for field, values in attrs.items():
        getattr(e, field).MergeFrom(type(getattr(e, field))(**values))  # type: ignore[arg-type]
    return e


def _task(
    first: int, at: tuple[float, float, float], kind: str, **scheduled: object
) -> list[HistoryEvent]:
    """A workflow or activity task (`kind`: WORKFLOW_TASK, ACTIVITY_TASK) scheduled, started
    and completed at `at`, its events numbered from `first`."""
    name = kind.lower()
    started, completed = (
        {f"{name}_{state}_event_attributes": {"scheduled_event_id": first}}
        for state in ("started", "completed")
    )
    return [
        _event(first, at[0], getattr(EventType, f"EVENT_TYPE_{kind}_SCHEDULED"), **scheduled),
        _event(first + 1, at[1], getattr(EventType, f"EVENT_TYPE_{kind}_STARTED"), **started),
        _event(first + 2, at[2], getattr(EventType, f"EVENT_TYPE_{kind}_COMPLETED"), **completed),
    ]


def _history() -> list[HistoryEvent]:
    k = EventType
    return [
        _event(1, -5.0, k.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED),  # before `since`: dropped
        _event(
            2, 0.1, k.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
            workflow_execution_signaled_event_attributes={"signal_name": "demand_changed"},
        ),
        *_task(3, (0.1, 0.4, 0.5), "WORKFLOW_TASK"),
        *_task(
            6, (0.5, 0.6, 0.9), "ACTIVITY_TASK",
            activity_task_scheduled_event_attributes={"activity_type": {"name": "snapshot"}},
        ),
        _event(9, 1.0, k.EVENT_TYPE_TIMER_STARTED),
        _event(
            10, 3.0, k.EVENT_TYPE_TIMER_FIRED, timer_fired_event_attributes={"started_event_id": 9}
        ),
    ]  # fmt: skip


def test_each_step_starts_and_lasts_as_its_events_say() -> None:
    steps = steps_of(_history(), since=T0)
    assert steps == [
        {"step": "signal received demand_changed", "at_s": 0.1, "took_s": 0.0},
        {"step": "workflow task", "at_s": 0.1, "took_s": 0.4, "queued_s": 0.3},
        {"step": "activity snapshot", "at_s": 0.5, "took_s": 0.4, "queued_s": 0.1},
        {"step": "timer", "at_s": 1.0, "took_s": 2.0},
    ]


def test_condensed_keeps_what_began_by_then_one_line_each() -> None:
    lines = condensed(steps_of(_history(), since=T0), until=0.9)
    assert lines == [
        "0.100 +0.000 signal received demand_changed",
        "0.100 +0.400 workflow task (queued 0.300)",
        "0.500 +0.400 activity snapshot (queued 0.100)",
    ]
    same_time = [{"step": "activity x", "at_s": 0.2, "took_s": t} for t in (0.1, 0.3)]
    assert condensed(same_time, until=1) == ["0.200 +0.300 activity x x 2"]
