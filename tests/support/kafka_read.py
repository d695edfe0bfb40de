"""Reading a whole topic back, for tests and benchmarks."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, TopicPartition

from activities.events import LifecycleEvent


def _from_the_beginning(bootstrap: str, topics: list[str]) -> Consumer:
    """A reader of no group (a fresh id, nothing committed) on every partition of `topics`,
    each from its beginning."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
            "log_level": 0,
        }
    )
    consumer.assign(
        [
            TopicPartition(topic, p, -2)  # -2: the partition's beginning
            for topic in topics
            for p in consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ]
    )
    return consumer


def read_topic(
    bootstrap: str,
    topic: str,
    *,
    expect: int,
    keep: Callable[[LifecycleEvent], bool] = lambda _e: True,
    timeout: float = 60,
) -> list[LifecycleEvent]:
    """The topic's events that `keep` accepts, per partition in offset order; reads until
    `expect` distinct event ids were seen or `timeout` passed."""
    consumer = _from_the_beginning(bootstrap, [topic])
    out: list[LifecycleEvent] = []
    distinct: set[object] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(distinct) < expect and time.monotonic() < deadline:
            for msg in consumer.consume(5000, timeout=0.5):
                if msg.error() is None:
                    event = LifecycleEvent.model_validate_json(msg.value() or b"")
                    if keep(event):
                        out.append(event)
                        distinct.add(event.event_id)
    finally:
        consumer.close()
    return out


def messages_in(bootstrap: str, topics: list[str], *, quiet: float = 3.0) -> int:
    """How many messages `topics` hold now: every partition read from its beginning by a
    reader of no group, until `quiet` seconds pass with nothing new (at most 120 s).

    Not the watermarks: tansu's are not record offsets (a partition holding 10 records
    written in one batch reported (0, 1)), and a count from them came up 4 of 60."""
    consumer = _from_the_beginning(bootstrap, topics)
    try:
        total = 0
        start = last_new = time.monotonic()
        while time.monotonic() - last_new < quiet and time.monotonic() - start < 120:
            read = sum(m.error() is None for m in consumer.consume(5000, timeout=0.5))
            if read:
                total, last_new = total + read, time.monotonic()
        return total
    finally:
        consumer.close()
