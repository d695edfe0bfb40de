"""The ledger consumer process (`sco ledger consume`): every region's lifecycle and
decision events from Kafka into the ClickHouse ledger until SIGTERM/SIGINT. The consuming
logic is `activities/ledger/consumer.py`."""

from __future__ import annotations

import logging

from prometheus_client import start_http_server

from activities.events import region_topics
from activities.ledger.consumer import ConsumerProgress, LedgerConsumer
from activities.ledger.store import LedgerStore
from workers.client_security import kafka_config, ledger_options, postgres_conninfo
from workers.settings import Settings
from workers.shutdown import thread_stop_event

log = logging.getLogger(__name__)


def run(settings: Settings) -> ConsumerProgress:
    """Consume until stopped; return the counts. The Kafka consumer leaves its group and
    the ledger client closes, whatever ends the loop."""
    topics = [t for r in settings.regions for t in region_topics(r)]
    if settings.ledger_metrics_port:
        start_http_server(settings.ledger_metrics_port)
    with thread_stop_event() as stop:
        store = LedgerStore(settings.effective_ledger_dsn, client_options=ledger_options(settings))
        try:
            store.ensure_schema()
            consumer = LedgerConsumer(
                settings.kafka.bootstrap_servers,
                topics,
                store,
                kafka_security=kafka_config(settings.kafka),
                dead_letter_dsn=postgres_conninfo(settings),
            )
            try:
                log.info(
                    "ledger consumer: %s → %s", ", ".join(topics), settings.effective_ledger_dsn
                )
                consumer.run(stop)
            finally:
                consumer.close()
        finally:
            store.close()
    return consumer.progress
