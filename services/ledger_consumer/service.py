"""The ledger consumer process (`sco ledger consume`): every region's lifecycle and
decision events from Kafka into the ClickHouse ledger until SIGTERM/SIGINT. The consuming
logic is `services/ledger_consumer/consumer.py`."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from activities.events import region_topics
from activities.ledger.holder import HolderSocket
from activities.ledger.store import LedgerStore
from contracts.redact import mask_credentials
from services.ledger_consumer.consumer import HOLDER_ANSWERS, ConsumerProgress, LedgerConsumer
from workers import procstat
from workers.client_security import kafka_config, ledger_options, postgres_conninfo
from workers.endpoints import health_thread, start_metrics
from workers.settings import Settings
from workers.shutdown import thread_stop_event

log = logging.getLogger(__name__)

#: A restarted consumer first warms up again (chDB loads, the group rejoins).
MIN_UPTIME_S = 60.0


def run(settings: Settings) -> ConsumerProgress:
    """Consume until stopped; return the counts. The Kafka consumer leaves its group and
    the ledger client closes, whatever ends the loop."""
    topics = [t for r in settings.regions for t in region_topics(r)]
    start_metrics(settings.ledger_metrics_port, setting="SCO_LEDGER_METRICS_PORT")
    consumer: LedgerConsumer | None = None
    # Ready: the ledger's schema is in place and Kafka answered the last poll.
    health = health_thread(
        settings.ledger_health_port, lambda: consumer is not None and consumer.healthy
    )
    with thread_stop_event() as stop:
        # Held open: every chDB reopen leaks inside the engine (activities/ledger/store.py).
        store = LedgerStore(
            settings.effective_ledger_dsn, client_options=ledger_options(settings), hold=True
        )
        # The worker's reclaim-rate reads and the drain intake's bookings are done here,
        # without handing the ledger over (decision 0043).
        reads = HolderSocket(store, on_answer=lambda op: HOLDER_ANSWERS.labels(op).inc())
        try:
            # Listening before the ledger is opened: a worker's read at the box's start is
            # answered here (in turn with the schema's set-up: one store, one lock), not by
            # a child that would take the ledger from this consumer. A holder still running
            # keeps its socket until this one holds the ledger, and so knows it has gone.
            listening = reads.start(take_over=False)
            store.ensure_schema()
            if not listening:
                reads.start()
            consumer = LedgerConsumer(
                settings.kafka.bootstrap_servers,
                topics,
                store,
                kafka_security=kafka_config(settings.kafka),
                dead_letter_dsn=postgres_conninfo(settings),
                renew_on_change=_client_cert_files(settings),
            )
            try:
                log.info(
                    "ledger consumer: %s → %s (Kafka %s)",
                    ", ".join(topics),
                    mask_credentials(settings.effective_ledger_dsn),
                    mask_credentials(settings.kafka.bootstrap_servers),
                )
                recycled = consumer.run(stop, recycle=_over(settings, store))
            finally:
                consumer.close()
        finally:
            reads.close()
            store.close()
            if health is not None:
                health.close()
    if recycled:
        # The engine cannot be unloaded from a process: start this one afresh (same pid,
        # same arguments; the group rejoins and resumes from the committed offsets).
        log.warning(
            "ledger consumer: resident memory %.0f MB is over ledger.recycle_rss_mb=%d;"
            " restarting itself",
            rss_mb(),
            settings.ledger.recycle_rss_mb,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, *_argv()])
    return consumer.progress


def _client_cert_files(settings: Settings) -> list[Path]:
    """The Kafka client certificate and key the consumer's client reads (none without
    TLS client certificates)."""
    t = settings.kafka.tls
    if not (t.enabled and t.client_cert_file and t.client_key_file):
        return []
    return [Path(t.client_cert_file), Path(t.client_key_file)]


def _over(settings: Settings, store: LedgerStore) -> Callable[[], bool]:
    """True once this process's VmRSS is over `ledger.recycle_rss_mb` (embedded chDB only)
    and it has been up MIN_UPTIME_S: a level, the one a memory limit holds it to, and a
    consumer whose warm-up alone passes it still restarts at most once a minute."""
    cap = settings.ledger.recycle_rss_mb
    if cap == 0 or store.path is None:
        return lambda: False
    started = time.monotonic()
    return lambda: time.monotonic() - started >= MIN_UPTIME_S and rss_mb() > cap


def rss_mb() -> float:
    """This process's resident memory (VmRSS), MB; 0 where /proc has none."""
    return procstat.rss_mb(os.getpid()) or 0.0


def _argv() -> list[str]:
    """How this process was started, for exec: `python -m workers.cli ...` or `sco ...`."""
    orig = getattr(sys, "orig_argv", None)
    if orig:
        return list(orig[1:])
    return list(sys.argv)
