"""The outbox relay: publishes committed lifecycle events to Kafka, in order.

One relay per region is active at a time (a PostgreSQL advisory lock elects it), so
events leave in outbox id order; per-instance order then holds in Kafka because the key
is the instance id. Rows are stamped sent only after the broker acknowledged them
(acks=all). While the broker is down rows wait in PostgreSQL: nothing is lost. A crash
between publish and stamp republishes a batch; every event carries its unique id, so
consumers dedupe.
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
from confluent_kafka import KafkaError, Message, Producer

from activities.fleet.outbox import NOTIFY_CHANNEL
from activities.kafka import producer_config

log = logging.getLogger(__name__)

# Arbitrary constant: the advisory lock that elects the one active relay.
_LEADER_LOCK_ID = 0x5C0_0002


class RelayError(RuntimeError):
    """An event the broker refuses for good (not a broker outage)."""


@dataclass
class RelayProgress:
    published: int = 0
    batches: int = 0
    waiting_for_broker_s: float = 0.0


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
    ) -> None:
        """`kafka_security`: librdkafka TLS/SASL settings added to the producer's."""
        self._dsn = dsn
        self._producer = Producer({**producer_config(bootstrap), **(kafka_security or {})})
        self._bootstrap = bootstrap
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
        rows = conn.execute(
            "SELECT id, event_id, topic, key, payload FROM outbox "
            "WHERE sent_at IS NULL ORDER BY id LIMIT %s",
            (self._batch_size,),
        ).fetchall()
        conn.commit()
        if not rows:
            return 0
        delivered: list[int] = []
        failures: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Message, row_id: int) -> None:
            if err is None:
                delivered.append(row_id)
            else:
                failures.append(f"outbox id {row_id}: {err}")

        for row_id, event_id, topic, key, payload in rows:
            self._produce(topic, key, payload, event_id, row_id, on_delivery)
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
        if delivered:
            conn.execute("UPDATE outbox SET sent_at = now() WHERE id = ANY(%s)", (delivered,))
            conn.commit()
        self.progress.published += len(delivered)
        self.progress.batches += 1
        if self._on_batch:
            self._on_batch(self.progress)
        if failures:
            raise RelayError("Kafka refused events: " + "; ".join(failures[:5]))
        return len(delivered)

    def _produce(
        self,
        topic: str,
        key: str,
        payload: object,
        event_id: object,
        row_id: int,
        on_delivery: Callable[[KafkaError | None, Message, int], None],
    ) -> None:
        value = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
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
                    log.info("relay: leading; publishing to %s", self._bootstrap)
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    conn.commit()
                    while not stop.is_set():
                        self._prune_if_due(conn)
                        if self.publish_batch(conn, stop) == 0:
                            # Wake on the next commit's NOTIFY; the timeout is the safety
                            # net for a notification lost to a reconnect.
                            for _ in conn.notifies(timeout=self._idle, stop_after=1):
                                pass
            except psycopg.OperationalError as exc:
                log.warning("relay: PostgreSQL unavailable (%s); retrying in 2 s", exc)
                stop.wait(2.0)

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
