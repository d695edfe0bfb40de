"""The outbox relay: publishes committed lifecycle events to Kafka, in order.

One relay per region is active at a time (a PostgreSQL advisory lock elects it), so
events leave in outbox id order; per-instance order then holds in Kafka because the key
is the instance id. Rows are stamped sent only after the broker acknowledged them
(acks=all). While the broker is down rows wait in PostgreSQL: nothing is lost. A crash
between publish and stamp republishes a batch; every event carries its unique id, so
consumers dedupe.

The broker may lose its state (a restart of an in-memory broker, a cluster rebuilt): the
idempotent producer then holds a producer id the broker no longer knows and every send
fails. Messages expire after `message_timeout_ms`, and any such broker-state error makes
the relay drop its producer, make a new one, and ensure the topics (with the configured
partitions) before it sends again. A row the broker refuses for itself (too large, say)
is retried `max_attempts` times, then parked as a dead letter with the reason.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from prometheus_client import Counter

from activities.backoff import CappedBackoff
from activities.fleet import dead_letters
from activities.fleet.outbox import NOTIFY_CHANNEL
from activities.kafka import KafkaUnavailable, TopicSpec, ensure_topics, producer_config
from contracts.redact import mask_credentials

log = logging.getLogger(__name__)

# Arbitrary constant: the advisory lock that elects the one active relay.
_LEADER_LOCK_ID = 0x5C0_0002


# Errors that say the broker (or our session with it) is gone or lost its state, not
# that it refused this one message: they never count toward a row's dead letter.
_BROKER_STATE_ERRORS = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._FATAL,
        KafkaError._PURGE_QUEUE,
        KafkaError._PURGE_INFLIGHT,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    }
)


def is_broker_state_error(err: KafkaError) -> bool:
    return bool(err.fatal() or err.retriable() or err.code() in _BROKER_STATE_ERRORS)


PUBLISHED = Counter("sco_outbox_published", "Outbox events published to Kafka (acknowledged)")
ERRORS = Counter(
    "sco_outbox_errors",
    "Relay failures: postgres, kafka (unavailable), refused (one row)",
    ["kind"],
)


@dataclass
class RelayProgress:
    published: int = 0
    batches: int = 0
    waiting_for_broker_s: float = 0.0
    producers_recreated: int = 0
    dead_lettered: int = 0


class OutboxRelay:
    def __init__(
        self,
        dsn: str,
        bootstrap: str,
        *,
        batch_size: int = 2000,
        idle_poll_seconds: float = 1.0,
        on_batch: Callable[[RelayProgress], None] | None = None,
        retention_hours: float = 24.0,
        kafka_security: Mapping[str, Any] | None = None,
        topics: TopicSpec | None = None,
        max_attempts: int = 5,
        message_timeout_ms: int = 30_000,
        max_message_bytes: int = 1_000_000,
    ) -> None:
        """`kafka_security`: librdkafka TLS/SASL settings added to the producer's."""
        self._dsn = dsn
        self._config = {
            **producer_config(
                bootstrap,
                message_timeout_ms=message_timeout_ms,
                max_message_bytes=max_message_bytes,
            ),
            **(kafka_security or {}),
        }
        self._producer = Producer(self._config)
        self._bootstrap = bootstrap
        self._security = dict(kafka_security or {})
        self._topics = topics
        self._topics_ensured = False
        self._max_attempts = max_attempts
        # Refusals per outbox row id, in this process: a restart gives a row fresh tries.
        self._attempts: dict[int, int] = {}
        self._backoff = CappedBackoff(initial=1.0, cap=30.0)
        self._batch_size = batch_size
        self._idle = idle_poll_seconds
        self._on_batch = on_batch
        self.progress = RelayProgress()
        self._retention_hours = retention_hours
        self._next_prune = 0.0

    def publish_batch(
        self, conn: psycopg.Connection[Any], stop: threading.Event | None = None
    ) -> int:
        """Publish the next batch of unsent rows; return how many were stamped sent."""
        self._ensure_topics()
        rows = conn.execute(
            "SELECT id, event_id, topic, key, payload FROM outbox "
            "WHERE sent_at IS NULL AND dead_lettered_at IS NULL ORDER BY id LIMIT %s",
            (self._batch_size,),
        ).fetchall()
        conn.commit()
        if not rows:
            return 0
        delivered: list[int] = []
        refused: dict[int, str] = {}
        broker_state: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Message, row_id: int) -> None:
            if err is None:
                delivered.append(row_id)
            elif is_broker_state_error(err):
                broker_state.append(str(err))
            else:
                refused[row_id] = str(err)

        values = {}
        for row_id, event_id, topic, key, payload in rows:
            value = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
            values[row_id] = (topic, key, value)
            try:
                self._produce(topic, key, value, event_id, row_id, on_delivery)
            except KafkaException as exc:  # refused before it left: too large, bad topic
                err = exc.args[0]
                if isinstance(err, KafkaError) and is_broker_state_error(err):
                    broker_state.append(str(err))
                    break
                refused[row_id] = str(exc)
        self._await_deliveries(stop)
        if delivered:
            conn.execute("UPDATE outbox SET sent_at = now() WHERE id = ANY(%s)", (delivered,))
            conn.commit()
        self.progress.published += len(delivered)
        PUBLISHED.inc(len(delivered))
        self.progress.batches += 1
        for row_id, reason in refused.items():
            self._refused(conn, row_id, values[row_id], reason)
        if broker_state:
            self._recreate_producer(broker_state[0], stop)
        elif delivered:
            self._backoff.reset()
        if self._on_batch:
            self._on_batch(self.progress)
        return len(delivered)

    def _await_deliveries(self, stop: threading.Event | None) -> None:
        # Bounded: every message is delivered, refused or expired within message_timeout_ms.
        waited_since = None
        while len(self._producer) > 0:
            self._producer.flush(1.0)
            if len(self._producer) > 0:
                # The broker is unreachable or slow: keep waiting, report it.
                waited_since = waited_since or time.monotonic()
                waited = time.monotonic() - waited_since
                self.progress.waiting_for_broker_s = waited
                log.warning(
                    "relay: %d events waiting for Kafka at %s (%.0f s)",
                    len(self._producer),
                    self._bootstrap,
                    waited,
                )
                if stop is not None and stop.is_set():
                    break
        self.progress.waiting_for_broker_s = 0.0

    def _refused(
        self,
        conn: psycopg.Connection[Any],
        row_id: int,
        message: tuple[str, str, bytes],
        reason: str,
    ) -> None:
        attempts = self._attempts.get(row_id, 0) + 1
        ERRORS.labels("refused").inc()
        if attempts < self._max_attempts:
            self._attempts[row_id] = attempts
            log.warning("relay: Kafka refused outbox id %d (try %d): %s", row_id, attempts, reason)
            return
        self._attempts.pop(row_id, None)
        topic, key, value = message
        letter = dead_letters.record(
            conn,
            source="outbox",
            topic=topic,
            key=key,
            value=value,
            reason=reason,
            attempts=attempts,
            outbox_id=row_id,
        )
        conn.commit()
        self.progress.dead_lettered += 1
        log.error(
            "relay: outbox id %d refused %d times, parked as dead letter %d: %s",
            row_id,
            attempts,
            letter,
            reason,
        )

    def _recreate_producer(self, reason: str, stop: threading.Event | None) -> None:
        """The broker lost our producer's state (or went away): a fresh producer (new
        producer id) and the topics ensured again before the next send."""
        wait = self._backoff.next()
        log.warning(
            "relay: Kafka at %s: %s; new producer and topics in %.1f s",
            self._bootstrap,
            reason,
            wait,
        )
        self._producer.purge()
        self._producer.flush(0)
        self._producer.close()
        self._producer = Producer(self._config)
        self._topics_ensured = False
        self.progress.producers_recreated += 1
        if stop is not None:
            stop.wait(wait)
        else:
            time.sleep(wait)

    def _ensure_topics(self) -> None:
        if self._topics is None or self._topics_ensured:
            return
        created = ensure_topics(
            self._bootstrap, self._topics.names, **self._topics.layout(), security=self._security
        )
        if created:
            log.info("relay: created topics %s", ", ".join(created))
        self._topics_ensured = True

    def _produce(
        self,
        topic: str,
        key: str,
        value: bytes,
        event_id: object,
        row_id: int,
        on_delivery: Callable[[KafkaError | None, Message, int], None],
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    topic,
                    key=key.encode(),
                    value=value,
                    headers={"event_id": str(event_id).encode()},
                    on_delivery=lambda err, msg: on_delivery(err, msg, row_id),
                )
                return
            except BufferError:  # local queue full: let deliveries drain, then retry
                self._producer.poll(0.5)

    def run(self, stop: threading.Event) -> None:
        """Publish until `stop` is set; stand by while another relay holds the lead."""
        while not stop.is_set():
            try:
                with psycopg.connect(self._dsn) as conn:
                    if not self._lead(conn, stop):
                        continue
                    log.info("relay: leading; publishing to %s", mask_credentials(self._bootstrap))
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    conn.commit()
                    while not stop.is_set():
                        self._prune_if_due(conn)
                        if self.publish_batch(conn, stop) == 0:
                            # Wake on the next commit's NOTIFY; the timeout is the safety
                            # net for a notification lost to a reconnect.
                            for _ in conn.notifies(timeout=self._idle, stop_after=1):
                                pass
            except psycopg.Error as exc:
                ERRORS.labels("postgres").inc()
                wait = self._backoff.next()
                log.warning("relay: PostgreSQL unavailable (%s); retrying in %.1f s", exc, wait)
                stop.wait(wait)
            except KafkaUnavailable as exc:
                ERRORS.labels("kafka").inc()
                wait = self._backoff.next()
                log.warning("relay: %s; retrying in %.1f s", exc, wait)
                stop.wait(wait)

    def close(self) -> None:
        """Shut the producer down at once, broker up or not. Events it still holds are
        dropped: their rows are unsent, so the next leader publishes them again (and
        consumers dedupe the few the broker had already taken)."""
        self._producer.purge()
        self._producer.flush(0)  # serves the purge's delivery reports
        self._producer.close()

    def _prune_if_due(self, conn: psycopg.Connection[Any]) -> None:
        if time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + 60
            self.prune(conn)

    def prune(self, conn: psycopg.Connection[Any]) -> int:
        """Delete sent rows past retention; unsent rows never go."""
        cur = conn.execute(
            "DELETE FROM outbox WHERE sent_at IS NOT NULL "
            "AND sent_at < now() - make_interval(secs => %s)",
            (self._retention_hours * 3600,),
        )
        conn.commit()
        if cur.rowcount:
            log.info(
                "relay: pruned %d sent events older than %.0f h",
                cur.rowcount,
                self._retention_hours,
            )
        return max(cur.rowcount, 0)

    @staticmethod
    def _lead(conn: psycopg.Connection[Any], stop: threading.Event) -> bool:
        while not stop.is_set():
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (_LEADER_LOCK_ID,)).fetchone()
            conn.commit()
            if row and row[0]:
                return True
            stop.wait(2.0)
        return False
