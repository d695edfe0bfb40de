"""The write side of the transactional outbox.

`enqueue` must be called on the same connection, inside the same transaction, as the
state change the event describes: both commit or neither does.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from activities.decisions import Decision
from activities.events import LifecycleEvent

#: The relay LISTENs here; NOTIFY is transactional, so it wakes the relay at commit.
NOTIFY_CHANNEL = "sco_outbox"


def enqueue(conn: psycopg.Connection[Any], event: LifecycleEvent | Decision) -> bool:
    """Queue the event; False when its id is already queued (a retried writer)."""
    key = event.instance_id if isinstance(event, LifecycleEvent) else event.key
    cur = conn.execute(
        "INSERT INTO outbox (event_id, topic, key, payload) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (event_id) DO NOTHING",
        (event.event_id, event.topic(), key, Jsonb(event.model_dump(mode="json"))),
    )
    if cur.rowcount == 0:
        return False
    # Many changes in one transaction collapse into one notification.
    conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")
    return True


def pending(conn: psycopg.Connection[Any]) -> tuple[int, float]:
    """Unsent events and the age in seconds of the oldest one (0 when none)."""
    row = conn.execute(
        "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0) "
        "FROM outbox WHERE sent_at IS NULL AND dead_lettered_at IS NULL"
    ).fetchone()
    assert row is not None
    return int(row[0]), float(row[1])
