"""Where to reset a wedged floor keeper: pure code over its history.

A keeper whose workflow task fails on every attempt (a nondeterminism error after worker
kills, issue 37) stays Running and answers no query until it is reset to a workflow task
from before the one that went wrong: Temporal then replays the kept events and runs the
keeper's code from there, its state intact up to that point. `sco floor reset` finds the
point by replaying the history with this code (the failing event it names) or, when replay
is clean, from the trailing run of failed workflow tasks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

_EVENT_IN_ERROR = re.compile(r"HistoryEvent\(id: (\d+)")


def failing_event(replay_error: str) -> int | None:
    """The event id a replay's nondeterminism error names, if it names one."""
    found = _EVENT_IN_ERROR.search(replay_error)
    return int(found.group(1)) if found else None


def _completed(events: Sequence[HistoryEvent], before: int) -> list[HistoryEvent]:
    return [
        e
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and e.event_id < before
    ]


def trailing_failures(events: Sequence[HistoryEvent]) -> list[HistoryEvent]:
    """The workflow-task failures since the last completed task (the keeper is wedged when
    this never empties)."""
    out: list[HistoryEvent] = []
    for e in reversed(events):
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            break
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            out.append(e)
    return out[::-1]


def reset_point(events: Sequence[HistoryEvent], bad_event: int | None) -> int | None:
    """The WorkflowTaskStarted event to reset to, or None when nothing is wrong.

    `bad_event`: the event replay with this code fails at. The task that wrote it (the
    last completed task before it) is dropped with it: the reset point is the task before
    that one. Without one, a trailing run of failed tasks: the last completed task before
    them is kept and the failing one re-runs."""
    if bad_event is not None:
        done = _completed(events, bad_event)
        return (
            done[-2].workflow_task_completed_event_attributes.started_event_id
            if len(done) >= 2
            else None
        )
    failed = trailing_failures(events)
    if not failed:
        return None
    done = _completed(events, failed[0].event_id)
    return done[-1].workflow_task_completed_event_attributes.started_event_id if done else None
