"""Reading a whole topic back, for tests and benchmarks."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, TopicPartition

from activities.events import LifecycleEvent


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
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    consumer.assign([TopicPartition(topic, p, -2) for p in meta.partitions])  # -2: beginning
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
