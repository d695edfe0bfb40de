"""Kafka plumbing shared by the outbox relay and the ledger consumer."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]


class KafkaUnavailable(RuntimeError):
    pass


class Layout(TypedDict):
    """How topics are laid out when they have to be created (`ensure_topics`)."""

    partitions: int
    replication_factor: int


@dataclass(frozen=True)
class TopicSpec:
    """The topics a producer keeps, and how they are laid out when it has to create them."""

    names: tuple[str, ...]
    partitions: int
    replication_factor: int

    def layout(self) -> Layout:
        return {"partitions": self.partitions, "replication_factor": self.replication_factor}


def producer_config(
    bootstrap: str, *, message_timeout_ms: int = 30_000, max_message_bytes: int = 1_000_000
) -> dict[str, Any]:
    """Idempotent producer: acks=all, no duplicates or reordering from internal retries.

    Messages expire after `message_timeout_ms` (never 0, "forever"): a broker that lost
    its state would otherwise be retried without end. An expired message is not lost: its
    outbox row stays unsent, and the relay sends it again with a new producer, in order.
    """
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "message.timeout.ms": message_timeout_ms,
        "message.max.bytes": max_message_bytes,
        "linger.ms": 5,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 200000,
    }


def _admin(bootstrap: str, security: Mapping[str, Any] | None) -> AdminClient:
    """An admin client that writes nothing of its own to stderr (log_level 0): its callers
    raise or return what went wrong, and librdkafka's lines (a probe of a broker that is
    down, "Purging 1 unserved events" when it is collected) would break a CLI's one-line
    error (`sco dev up` on a taken port printed one before its own)."""
    return AdminClient({**(security or {}), "bootstrap.servers": bootstrap, "log_level": 0})


def ensure_topics(
    bootstrap: str,
    topics: Iterable[str],
    *,
    partitions: int,
    replication_factor: int,
    security: Mapping[str, Any] | None = None,
) -> list[str]:
    """Create missing topics; return the ones created. Existing topics are left alone.
    `security`: librdkafka TLS/SASL settings (workers/client_security.kafka_config)."""
    admin = _admin(bootstrap, security)
    try:
        existing = set(admin.list_topics(timeout=10).topics)
    except KafkaException as exc:
        raise KafkaUnavailable(f"Kafka at {bootstrap} does not answer: {exc}") from exc
    missing = [t for t in topics if t not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [
            NewTopic(t, num_partitions=partitions, replication_factor=replication_factor)
            for t in missing
        ],
        operation_timeout=10,
    )
    created = []
    for topic, future in futures.items():
        try:
            future.result(timeout=15)
            created.append(topic)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):  # lost a race with another creator
                raise KafkaUnavailable(f"creating topic {topic} on {bootstrap}: {exc}") from exc
    return created


def kafka_answers(
    bootstrap: str, timeout: float = 3.0, security: Mapping[str, Any] | None = None
) -> bool:
    try:
        _admin(bootstrap, security).list_topics(timeout=timeout)
    except KafkaException:
        return False
    return True
