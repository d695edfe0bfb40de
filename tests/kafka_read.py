"""Reading a whole topic back, for tests and benchmarks."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from activities.events import LifecycleEvent


def read_topic(
    bootstrap: str, topic: str, *, expect: int, timeout: float = 60
) -> list[LifecycleEvent]:
    """Every event in the topic, per partition in offset order (waits until `expect` seen)."""
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
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expect and time.monotonic() < deadline:
            for msg in consumer.consume(5000, timeout=0.5):
                if msg.error() is None:
                    out.append(LifecycleEvent.model_validate_json(msg.value() or b""))
    finally:
        consumer.close()
    return out
