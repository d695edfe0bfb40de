"""The ledger consumer: lifecycle events from Kafka into the ClickHouse ledger.

At-least-once: offsets are committed only after the batch is in the ledger. The ledger
table dedupes by event id, so a replayed topic or a crash between insert and commit
never double-counts spend.

A message that does not parse is parked as a dead letter in fleet state (with where it
was read and why), before its offset is committed: nothing is dropped silently.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from prometheus_client import Counter, Gauge
from pydantic import ValidationError

from activities.backoff import CappedBackoff
from activities.decisions import Decision
from activities.events import LifecycleEvent
from activities.fleet import dead_letters
from activities.ledger.store import LedgerStore

log = logging.getLogger(__name__)

ROWS_WRITTEN = Counter("sco_ledger_rows_written", "Rows inserted into the ledger", ["table"])
REFUSED = Counter(
    "sco_ledger_events_refused", "Events the ledger refused (unparsable: parked as dead letters)"
)
LAG = Gauge(
    "sco_ledger_consumer_lag",
    "Messages on the broker not yet consumed, per topic (the group's assigned partitions)",
    ["topic"],
)
ENGINE_RELEASES = Counter(
    "sco_ledger_engine_releases",
    "Times a held embedded ledger was closed for another process (one writing to it, a read "
    "whose answer is too big for the holder's socket, or one that found no socket answering); "
    "chDB keeps ~2 MB of each open, so the consumer's memory steps up with these until "
    "ledger.recycle_rss_mb restarts it",
)
HOLDER_ANSWERS = Counter(
    "sco_ledger_holder_answers",
    "Requests a held embedded ledger answered on its socket without letting it go: the "
    "worker's reclaim-rate reads, the drain intake's bookings, and the queries of `sco ledger`, "
    "`sco why` and the console (activities/ledger/holder.py)",
    ["request"],
)
#: What the consumer logs at each release (bench/memory_hour_bench.py counts these lines).
RELEASE_LOGGED = "engine released for another process"
#: The lag is measured at most this often (it asks the broker for each partition's end).
LAG_EVERY_SECONDS = 5.0
#: How often the client certificate's files are looked at for a renewal.
RENEWAL_EVERY_SECONDS = 5.0


def _stamps(files: Sequence[Path]) -> tuple[tuple[int, int], ...]:
    """(mtime_ns, size) of each file; a missing one (mid-rename) as (0, 0)."""
    out = []
    for f in files:
        try:
            st = os.stat(f)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((0, 0))
    return tuple(out)


@dataclass
class ConsumerProgress:
    consumed: int = 0
    inserted: int = 0
    malformed: int = 0
    dead_lettered: int = 0


class LedgerConsumer:
    def __init__(
        self,
        bootstrap: str,
        topics: Sequence[str],
        store: LedgerStore,
        *,
        group_id: str = "sco-ledger",
        batch_size: int = 5000,
        from_beginning: bool = True,
        kafka_security: Mapping[str, Any] | None = None,
        dead_letter_dsn: str | None = None,
        renew_on_change: Sequence[Path] = (),
    ) -> None:
        """`kafka_security`: librdkafka TLS/SASL settings added to the consumer's.
        `renew_on_change`: the client certificate and key files; when one changes (a
        renewal) a new Kafka client replaces the old between batches, since librdkafka
        reads them only when a client is made (decision 0036)."""
        self._config: dict[str, Any] = {
            **(kafka_security or {}),
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest" if from_beginning else "latest",
            # A short session: a dead consumer's partitions move within seconds, and
            # a group join does not wait out the 45 s default (tansu holds joins
            # for about half a session).
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            # The broker may hold a fetch this long when nothing is new; keep it short
            # so a fresh event does not sit behind an idle long-poll.
            "fetch.wait.max.ms": 100,
        }
        self._consumer = Consumer(self._config)
        self._consumer.subscribe(list(topics))
        self._renew_files = list(renew_on_change)
        self._renew_stamps = _stamps(self._renew_files)
        self._next_renewal_check = time.monotonic() + RENEWAL_EVERY_SECONDS
        #: Kafka clients made after the first (each after a certificate renewal).
        self.renewals = 0
        self._store = store
        self._batch_size = batch_size
        self._dead_letter_dsn = dead_letter_dsn
        self._stop = threading.Event()
        self.progress = ConsumerProgress()
        self._topics = list(topics)
        self._next_lag = 0.0
        #: False after Kafka failed the last poll or commit, True after one succeeded.
        self.healthy = False
        self.engine_releases = 0  # this run's, for its log line (the counter: the process's)
        for table in ("events", "decisions"):
            ROWS_WRITTEN.labels(table)

    def poll_batch(self, timeout: float = 1.0) -> int:
        """Consume up to one batch, write it to the ledger, commit; return events inserted."""
        # Wait for the first message only; then take whatever else is already here, so a
        # quiet topic costs latency of one poll, not of a filled batch.
        first = self._consumer.poll(timeout)
        if first is None:
            return 0
        messages = [first, *self._consumer.consume(self._batch_size - 1, timeout=0)]
        events: list[LifecycleEvent] = []
        decisions: list[Decision] = []
        malformed: list[tuple[Message, str]] = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("ledger: consume error: %s", err)
                continue
            self.progress.consumed += 1
            try:
                # Topics are sco.<region>.lifecycle and sco.<region>.decisions.
                if (msg.topic() or "").endswith(".decisions"):
                    decisions.append(Decision.model_validate_json(msg.value() or b""))
                else:
                    events.append(LifecycleEvent.model_validate_json(msg.value() or b""))
            except ValidationError as exc:
                # A malformed event must not wedge the ledger: it is parked, counted, logged.
                self.progress.malformed += 1
                REFUSED.inc()
                malformed.append((msg, str(exc).splitlines()[0] if str(exc) else repr(exc)))
                log.error(
                    "ledger: malformed event at %s[%s]@%s: %s",
                    msg.topic(),
                    msg.partition(),
                    msg.offset(),
                    exc,
                )
        if events:
            self._store.insert_events(events)
            self.progress.inserted += len(events)
            ROWS_WRITTEN.labels("events").inc(len(events))
        if decisions:
            self._store.insert_decisions(decisions)
            self.progress.inserted += len(decisions)
            ROWS_WRITTEN.labels("decisions").inc(len(decisions))
        if malformed:
            self._park(malformed)
        if any(msg.error() is None for msg in messages):
            self._consumer.commit(asynchronous=False)
        return len(events) + len(decisions)

    def _park(self, malformed: list[tuple[Message, str]]) -> None:
        """Dead-letter `malformed`; while fleet state is down, wait (the offsets are not
        committed until they are parked, so a stop meanwhile reads them again)."""
        if self._dead_letter_dsn is None:
            return
        backoff = CappedBackoff(initial=0.5, cap=10.0)
        while True:
            try:
                with psycopg.connect(self._dead_letter_dsn, connect_timeout=5) as conn:
                    for msg, reason in malformed:
                        dead_letters.record(
                            conn,
                            source="ledger",
                            topic=msg.topic() or "",
                            key=(msg.key() or b"").decode(errors="replace"),
                            value=msg.value() or b"",
                            reason=f"unparsable: {reason}",
                            location=f"{msg.topic()}[{msg.partition()}]@{msg.offset()}",
                        )
                self.progress.dead_lettered += len(malformed)
                return
            except psycopg.Error as exc:
                wait = backoff.next()
                log.warning("ledger: cannot park dead letters (%s); retrying in %.1f s", exc, wait)
                if self._stop.wait(wait):
                    raise

    def run(
        self,
        stop: threading.Event,
        poll_seconds: float = 0.2,
        recycle: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Consume until `stop`, or until `recycle()` says so between batches (then True:
        everything read so far is in the ledger and committed). A broker that is away or
        restarting (a failed commit or fetch) is waited out with capped backoff: what was
        inserted but not committed is committed with the next batch, or read again and
        deduplicated by the ledger."""
        self._stop = stop
        backoff = CappedBackoff(initial=0.5, cap=10.0)
        # A short poll keeps commit-to-ledger latency low; under load batches fill anyway.
        while not stop.is_set():
            if recycle():
                return True
            try:
                self._renew_client_if_changed()
                self.poll_batch(timeout=poll_seconds)
                if time.monotonic() >= self._next_lag:
                    self._next_lag = time.monotonic() + LAG_EVERY_SECONDS
                    self.measure_lag()
                self.healthy = True
                backoff.reset()
                # A held embedded ledger is let go between batches when a CLI waits.
                if self._store.release_if_wanted():
                    self.engine_releases += 1
                    ENGINE_RELEASES.inc()
                    log.info("ledger: %s (%d so far)", RELEASE_LOGGED, self.engine_releases)
            except KafkaException as exc:
                self.healthy = False
                wait = backoff.next()
                log.warning("ledger: Kafka unavailable (%s); retrying in %.1f s", exc, wait)
                stop.wait(wait)
        return False

    def _renew_client_if_changed(self) -> None:
        """A new Kafka client when the certificate files changed (between batches: what was
        read is in the ledger and committed, so the new member resumes from there)."""
        if not self._renew_files or time.monotonic() < self._next_renewal_check:
            return
        self._next_renewal_check = time.monotonic() + RENEWAL_EVERY_SECONDS
        stamps = _stamps(self._renew_files)
        if stamps == self._renew_stamps or (0, 0) in stamps:
            return  # unchanged, or a file mid-replacement: look again next time
        self._renew_stamps = stamps
        log.info("ledger: Kafka client certificate renewed; a new consumer joins the group")
        self._commit_positions()
        self._consumer.close()
        self._consumer = Consumer(self._config)
        self._consumer.subscribe(self._topics)
        self.renewals += 1

    def _commit_positions(self) -> None:
        """Commit where this client has read to, before a new client replaces it: what it
        read is in the ledger, and the new member starts at the group's last commit. A
        batch whose commit was refused would otherwise be read again (the whole topic, for
        a group that never committed), or skipped with auto.offset.reset latest. A refused
        commit here leaves the last one: that span is read again and deduplicated."""
        try:
            assigned = self._consumer.assignment()
            read = [tp for tp in self._consumer.position(assigned) if tp.offset >= 0]
            if read:
                self._consumer.commit(offsets=read, asynchronous=False)
        except KafkaException as exc:
            log.warning("ledger: positions not committed before a new client: %s", exc)

    def measure_lag(self) -> dict[str, int]:
        """Per topic: the partitions' end offsets minus the group's position (its
        committed offset before the first fetch, the partition's start before any)."""
        lag = dict.fromkeys(self._topics, 0)
        assigned = self._consumer.assignment()
        positions = {
            (tp.topic, tp.partition): tp.offset for tp in self._consumer.position(assigned)
        }
        for tp in assigned:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=2
            )
            at = positions.get((tp.topic, tp.partition), -1)
            lag[tp.topic] = lag.get(tp.topic, 0) + max(high - (at if at >= 0 else low), 0)
        for topic, n in lag.items():
            LAG.labels(topic).set(n)
        return lag

    def close(self) -> None:
        self._consumer.close()
