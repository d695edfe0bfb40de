"""The region's outbox relay process (`sco outbox relay`): committed lifecycle events from
fleet state to Kafka until SIGTERM/SIGINT. One relay leads per region (advisory lock); the
publishing logic is `services/outbox_relay/relay.py`."""

from __future__ import annotations

import logging

from activities.events import region_topics
from activities.kafka import TopicSpec
from services.outbox_relay.metrics import OutboxGauges
from services.outbox_relay.relay import OutboxRelay, RelayProgress
from workers.client_security import kafka_config, postgres_conninfo
from workers.endpoints import health_thread, start_metrics
from workers.settings import Settings
from workers.shutdown import thread_stop_event

log = logging.getLogger(__name__)

# One progress line per this many batches: a busy relay would otherwise log every batch.
_REPORT_EVERY = 50


def run(settings: Settings) -> RelayProgress:
    """Publish until stopped; return what was published. The relay's PostgreSQL session
    and Kafka producer close when it stops; unsent rows stay for the next leader."""

    def report(p: RelayProgress) -> None:
        if p.batches % _REPORT_EVERY == 1:
            log.info("relay: %d events published in %d batches", p.published, p.batches)

    start_metrics(settings.outbox.metrics_port, setting="SCO_OUTBOX__METRICS_PORT")
    gauges = OutboxGauges(
        postgres_conninfo(settings),
        settings.kafka.bootstrap_servers,
        kafka_security=kafka_config(settings.kafka),
    )
    gauges.start()
    health = health_thread(settings.outbox.health_port, lambda: gauges.ready)
    with thread_stop_event() as stop:
        relay = OutboxRelay(
            postgres_conninfo(settings),
            settings.kafka.bootstrap_servers,
            kafka_security=kafka_config(settings.kafka),
            batch_size=settings.outbox.batch_size,
            idle_poll_seconds=settings.outbox.idle_poll_seconds,
            retention_hours=settings.outbox.retention_hours,
            on_batch=report,
            # Every region's topics: a broker that lost them gets all of them back.
            topics=TopicSpec(
                tuple(t for r in settings.regions for t in region_topics(r)),
                partitions=settings.kafka.partitions,
                replication_factor=settings.kafka.replication_factor,
            ),
            max_attempts=settings.outbox.max_attempts,
            message_timeout_ms=round(settings.outbox.message_timeout_seconds * 1000),
            max_message_bytes=settings.kafka.max_message_bytes,
        )
        try:
            relay.run(stop)
        finally:
            relay.close()
            gauges.close()
            if health is not None:
                health.close()
    return relay.progress
