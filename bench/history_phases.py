"""Where a workflow's time went, read from its Temporal history: each step's start and end
relative to a moment the bench took (e.g. the signal it sent), so a latency figure comes
with the steps it is made of (an activity's queue wait and run, a local activity, a timer,
a child started, a signal sent or received).

    steps = await history_steps(handle, since=signal_sent_at)  # [{"step", "at_s", "took_s"}]

Times are the server's event times (wall clock, UTC) against `since` (the bench's
`time.time()` at the moment it measures from): on one machine the two clocks are one.
"""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

#: The events that close an activity -> the attributes naming the event that scheduled it.
_ACTIVITY_END = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "activity_task_canceled_event_attributes",
}

#: Steps a timer and a child workflow make: the event that opens one -> its name, the event
#: that closes it -> (its attributes, the field naming the opening event).
_OPENS = {
    EventType.EVENT_TYPE_TIMER_STARTED: "timer",
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED: "child started",
}
_CLOSES = {
    EventType.EVENT_TYPE_TIMER_FIRED: ("timer_fired_event_attributes", "started_event_id"),
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED: (
        "child_workflow_execution_started_event_attributes",
        "initiated_event_id",
    ),
}


def _epoch(event: Any) -> float:
    return float(event.event_time.seconds) + float(event.event_time.nanos) / 1e9


def steps_of(events: list[Any], since: float) -> list[dict[str, Any]]:
    """The steps of `events` (a history's, in order) that end after `since`: activities
    (queued = scheduled -> started, took = scheduled -> closed), local activities (their
    marker: recorded when the workflow task that ran them completed), workflow tasks
    (scheduled -> completed), timers, children started, signals sent and received."""
    scheduled: dict[int, tuple[str, float]] = {}
    started: dict[int, float] = {}
    out: list[dict[str, Any]] = []

    def add(step: str, begin: float, end: float, **extra: float) -> None:
        if end < since:
            return
        out.append(
            {"step": step, "at_s": round(begin - since, 3), "took_s": round(end - begin, 3)}
            | {k: round(v, 3) for k, v in extra.items()}
        )

    for e in events:
        when = _epoch(e)
        t = e.event_type
        if t == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[e.event_id] = (name, when)
        elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started[e.activity_task_started_event_attributes.scheduled_event_id] = when
        elif t in _ACTIVITY_END:
            sid = getattr(e, _ACTIVITY_END[t]).scheduled_event_id
            if sid in scheduled:
                name, begin = scheduled[sid]
                queued = started.get(sid, when)
                add(f"activity {name}", begin, when, queued_s=queued - begin)
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled[e.event_id] = ("workflow task", when)
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started[e.workflow_task_started_event_attributes.scheduled_event_id] = when
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            sid = e.workflow_task_completed_event_attributes.scheduled_event_id
            if sid in scheduled:
                begin = scheduled[sid][1]
                add("workflow task", begin, when, queued_s=started.get(sid, when) - begin)
        elif t == EventType.EVENT_TYPE_MARKER_RECORDED:
            add(f"marker {e.marker_recorded_event_attributes.marker_name}", when, when)
        elif t in _OPENS:
            scheduled[e.event_id] = (_OPENS[t], when)
        elif t in _CLOSES:
            attributes, opened_by = _CLOSES[t]
            sid = getattr(getattr(e, attributes), opened_by)
            if sid in scheduled:
                add(*scheduled[sid], when)
        elif t == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
            name = e.signal_external_workflow_execution_initiated_event_attributes.signal_name
            add(f"signal sent {name}", when, when)
        elif t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            name = e.workflow_execution_signaled_event_attributes.signal_name
            add(f"signal received {name}", when, when)
        elif t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            add("started", when, when)
    return out


async def history_steps(handle: WorkflowHandle[Any, Any], since: float) -> list[dict[str, Any]]:
    """`steps_of` the workflow's current run's history."""
    events = [e async for e in handle.fetch_history_events()]
    return steps_of(events, since)


def condensed(steps: list[dict[str, Any]], until: float) -> list[str]:
    """`steps` that began by `until` (seconds after `since`), one line each, those of one
    name that began within the same 10 ms as one line (`x N`, the longest): an
    acquisition's slots each write their state and send their signals at once.
    E.g. `0.094 +0.030 activity control.exact_plan (queued 0.000)`."""
    rows: dict[tuple[str, float], dict[str, Any]] = {}
    for s in steps:
        if s["at_s"] > until:
            continue
        key = (s["step"], round(s["at_s"], 2))
        row = rows.get(key)
        if row is None:
            rows[key] = dict(s, n=1)
        else:
            row["n"] += 1
            row["took_s"] = max(row["took_s"], s["took_s"])
    lines = []
    for r in sorted(rows.values(), key=lambda r: (r["at_s"], r["step"])):
        queued = f" (queued {r['queued_s']:.3f})" if "queued_s" in r else ""
        times = f" x {r['n']}" if r["n"] > 1 else ""
        lines.append(f"{r['at_s']:.3f} +{r['took_s']:.3f} {r['step']}{queued}{times}")
    return lines
