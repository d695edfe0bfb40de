"""The outbox relay's own gauges, on the real PostgreSQL and broker: unsent rows, the age
of the oldest, and readiness (PostgreSQL and Kafka answer)."""

from __future__ import annotations

import uuid

import psycopg
from prometheus_client import REGISTRY
from psycopg.types.json import Jsonb

from services.outbox_relay.metrics import OutboxGauges
from tests.support import services


def test_pending_rows_oldest_age_and_readiness(pg_dsn: str, kafka_bootstrap: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(
            "INSERT INTO outbox (event_id, topic, key, payload, created_at) "
            "VALUES (%s, 'sco.test.lifecycle', 'k', %s, now() - interval '90 seconds')",
            (uuid.uuid4(), Jsonb({})),
        )
    gauges = OutboxGauges(pg_dsn, kafka_bootstrap)
    gauges.collect_once()
    assert gauges.ready
    assert (REGISTRY.get_sample_value("sco_outbox_pending") or 0) >= 1
    assert (REGISTRY.get_sample_value("sco_outbox_oldest_unsent_age_seconds") or 0) >= 90

    dead_broker = OutboxGauges(pg_dsn, f"127.0.0.1:{services.free_port()}")
    dead_broker.collect_once()
    assert dead_broker.postgres_ok and not dead_broker.kafka_ok and not dead_broker.ready
    dead_db = OutboxGauges(
        f"postgresql://postgres@127.0.0.1:{services.free_port()}/x", kafka_bootstrap
    )
    dead_db.collect_once()
    assert not dead_db.postgres_ok and not dead_db.ready
