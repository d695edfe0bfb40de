"""What the outbox relay process measures beside its publishing loop, on a thread of its
own so a relay stuck on a dead broker still reports: the unsent rows, the age of the
oldest, and whether PostgreSQL and Kafka answer (the relay's readiness)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import psycopg
from prometheus_client import Gauge

from activities.kafka import kafka_answers
from services.outbox_relay.relay import ERRORS
from workers.endpoints import DEPENDENCY_UP

log = logging.getLogger(__name__)

PENDING = Gauge("sco_outbox_pending", "Outbox rows not yet published (dead letters excluded)")
OLDEST_AGE = Gauge(
    "sco_outbox_oldest_unsent_age_seconds", "Age of the oldest unpublished outbox row; 0 if none"
)
DEAD_LETTERS_OPEN = Gauge(
    "sco_outbox_dead_letters_open", "Dead letters (outbox and ledger) not retried yet"
)

_QUERY = """SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0),
                   (SELECT count(*) FROM dead_letters WHERE retried_at IS NULL)
            FROM outbox WHERE sent_at IS NULL AND dead_lettered_at IS NULL"""


class OutboxGauges:
    def __init__(
        self,
        dsn: str,
        bootstrap: str,
        *,
        kafka_security: Mapping[str, Any] | None = None,
        interval_seconds: float = 5.0,
    ) -> None:
        self._dsn = dsn
        self._bootstrap = bootstrap
        self._kafka_security = kafka_security
        self._interval = interval_seconds
        self.postgres_ok = self.kafka_ok = False
        for kind in ("postgres", "kafka", "refused"):
            ERRORS.labels(kind)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="outbox-gauges", daemon=True)

    @property
    def ready(self) -> bool:
        return self.postgres_ok and self.kafka_ok

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def collect_once(self) -> None:
        try:
            with psycopg.connect(self._dsn, connect_timeout=3) as conn:
                row = conn.execute(_QUERY).fetchone()
            assert row is not None
            PENDING.set(row[0])
            OLDEST_AGE.set(float(row[1]))
            DEAD_LETTERS_OPEN.set(row[2])
            self.postgres_ok = True
        except psycopg.Error as exc:
            # The last known figures stay: a relay that cannot see its outbox is not ready.
            log.debug("outbox gauges: PostgreSQL unavailable: %s", exc)
            self.postgres_ok = False
        self.kafka_ok = kafka_answers(self._bootstrap, timeout=3, security=self._kafka_security)
        DEPENDENCY_UP.labels("postgres").set(int(self.postgres_ok))
        DEPENDENCY_UP.labels("kafka").set(int(self.kafka_ok))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.collect_once()
            self._stop.wait(self._interval)
