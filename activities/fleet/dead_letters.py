"""Dead letters: events that could not go on, kept with the reason (migration 0005).

The outbox relay parks a row the broker refused `max_attempts` times; the ledger consumer
parks a message it cannot parse; the drain intake parks a drain report it refuses. All count
in `sco_dead_letters_total` (Prometheus, served by the process's metrics port), so a dead
letter alerts instead of hiding.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
from prometheus_client import Counter

Source = Literal["outbox", "ledger", "drain"]

DEAD_LETTERS = Counter(
    "sco_dead_letters", "Events parked as dead letters, by where they failed", ["source"]
)


class DeadLetterNotFound(LookupError):
    pass


@dataclass(frozen=True)
class DeadLetter:
    id: int
    source: Source
    outbox_id: int | None
    topic: str
    key: str
    value: bytes
    reason: str
    attempts: int
    location: str
    created_at: datetime
    retried_at: datetime | None


_COLUMNS = (
    "id, source, outbox_id, topic, key, value, reason, attempts, location, created_at, retried_at"
)


def record(
    conn: psycopg.Connection[Any],
    *,
    source: Source,
    topic: str,
    key: str,
    value: bytes,
    reason: str,
    attempts: int = 1,
    outbox_id: int | None = None,
    location: str = "",
) -> int:
    """Park one event (in the caller's transaction); an outbox row is marked dead-lettered
    so the relay skips it until retried."""
    row = conn.execute(
        "INSERT INTO dead_letters (source, outbox_id, topic, key, value, reason, attempts, "
        "location) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (source, outbox_id, topic, key, value, reason, attempts, location),
    ).fetchone()
    if outbox_id is not None:
        conn.execute("UPDATE outbox SET dead_lettered_at = now() WHERE id = %s", (outbox_id,))
    DEAD_LETTERS.labels(source=source).inc()
    assert row is not None
    return int(row[0])


def list_dead_letters(
    conn: psycopg.Connection[Any], *, include_retried: bool = False
) -> list[DeadLetter]:
    where = "" if include_retried else "WHERE retried_at IS NULL "
    rows = conn.execute(f"SELECT {_COLUMNS} FROM dead_letters {where}ORDER BY id").fetchall()
    return [_letter(r) for r in rows]


def get(conn: psycopg.Connection[Any], dead_letter_id: int) -> DeadLetter:
    r = conn.execute(
        f"SELECT {_COLUMNS} FROM dead_letters WHERE id = %s", (dead_letter_id,)
    ).fetchone()
    if r is None:
        raise DeadLetterNotFound(f"dead letter {dead_letter_id}: no such dead letter")
    return _letter(r)


def _letter(r: tuple[Any, ...]) -> DeadLetter:
    return DeadLetter(
        id=r[0],
        source=r[1],
        outbox_id=r[2],
        topic=r[3],
        key=r[4],
        value=bytes(r[5]),
        reason=r[6],
        attempts=r[7],
        location=r[8],
        created_at=r[9],
        retried_at=r[10],
    )


def retry_outbox(conn: psycopg.Connection[Any], dead_letter_id: int) -> DeadLetter:
    """Put a parked outbox row back in the relay's queue (in id order, so it goes next)."""
    letter = get(conn, dead_letter_id)
    if letter.outbox_id is None:
        raise ValueError(f"dead letter {dead_letter_id} is not an outbox row ({letter.source})")
    conn.execute("UPDATE outbox SET dead_lettered_at = NULL WHERE id = %s", (letter.outbox_id,))
    mark_retried(conn, dead_letter_id)
    return letter


def mark_retried(conn: psycopg.Connection[Any], dead_letter_id: int) -> None:
    conn.execute("UPDATE dead_letters SET retried_at = now() WHERE id = %s", (dead_letter_id,))
