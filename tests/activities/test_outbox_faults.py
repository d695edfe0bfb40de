"""The outbox relay against broker faults: an event the broker refuses becomes a dead
letter (and goes out when retried), and a broker restart that lost every producer id and
topic is survived by the relay alone. Chaos cases print their counts (tests/support/chaos.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg.types.json import Jsonb

from activities.events import (
    lifecycle_topic,
    region_topics,
)
from activities.fleet import dead_letters
from activities.fleet.migrate import migrate
from activities.kafka import TopicSpec, ensure_topics
from activities.ledger.store import TABLE, LedgerStore
from services.ledger_consumer.consumer import LedgerConsumer
from services.outbox_relay.relay import OutboxRelay
from tests.support import chaos, services
from tests.support.kafka_read import read_topic
from tests.support.ledger_events import cpu_event
from tests.support.paths import BASE_DSN, REPO
from tests.support.wait import eventually
from workers.devbox.services import KafkaService
from workers.settings import Settings


@pytest.fixture
def outbox_db() -> Iterator[str]:
    """A migrated database of its own: no other test's rows in its outbox."""
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    yield dsn
    services.drop_database(dsn)


def event_payload(instance: str, reason: str = "") -> dict[str, object]:
    """A lifecycle event as the outbox holds it."""
    event = cpu_event(instance, reason=reason)
    return event.model_dump(mode="json")


def enqueue_raw(dsn: str, payload: dict[str, object]) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "INSERT INTO outbox (event_id, topic, key, payload) VALUES (%s, %s, %s, %s) "
            "RETURNING id",
            (payload["event_id"], lifecycle_topic("r1"), payload["instance_id"], Jsonb(payload)),
        ).fetchone()
    assert row is not None
    return int(row[0])


def drain(relay: OutboxRelay, dsn: str, rounds: int) -> None:
    with psycopg.connect(dsn) as conn:
        for _ in range(rounds):
            relay.publish_batch(conn)


@pytest.mark.chaos
def test_a_poison_event_becomes_a_dead_letter_and_goes_out_when_retried(
    outbox_db: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    good = enqueue_raw(outbox_db, event_payload("good"))
    poison_payload = event_payload(f"poison-{uuid.uuid4().hex[:6]}", reason="x" * 30_000)
    poison = enqueue_raw(outbox_db, poison_payload)
    after = enqueue_raw(outbox_db, event_payload("after"))
    # The broker-side limit stands in for any refusal of one message for itself.
    relay = OutboxRelay(outbox_db, kafka_bootstrap, max_attempts=3, max_message_bytes=10_000)
    try:
        drain(relay, outbox_db, rounds=4)
    finally:
        relay.close()
    with psycopg.connect(outbox_db) as conn:
        sent: dict[int, bool] = dict(
            conn.execute("SELECT id, sent_at IS NOT NULL FROM outbox").fetchall()
        )
        letters = dead_letters.list_dead_letters(conn)
    # The poison row neither blocks the rows behind it nor stays in the queue.
    assert sent == {good: True, poison: False, after: True}
    assert [(d.source, d.outbox_id, d.attempts) for d in letters] == [("outbox", poison, 3)]
    assert "too large" in letters[0].reason.lower() or "MSG_SIZE" in letters[0].reason
    assert relay.progress.dead_lettered == 1

    env = {
        **os.environ,
        "SCO_POSTGRES_DSN": outbox_db,
        "SCO_REGIONS_DIR": str(REPO / "deploy/regions"),
    }
    code, out = asyncio.run(services.run_sco(env, "outbox", "dead-letters", cwd=REPO))
    assert code == 0 and "1 dead letters" in out and "poison" in out, out
    code, out = asyncio.run(services.run_sco(env, "outbox", "retry", str(letters[0].id), cwd=REPO))
    assert code == 0 and "requeued" in out, out
    # After the operator's fix (here: a relay that takes bigger messages) it goes out.
    relay = OutboxRelay(outbox_db, kafka_bootstrap, max_message_bytes=1_000_000)
    try:
        drain(relay, outbox_db, rounds=1)
    finally:
        relay.close()
    got = read_topic(
        kafka_bootstrap,
        lifecycle_topic("r1"),
        expect=1,
        keep=lambda e: str(e.event_id) == poison_payload["event_id"],
    )
    with psycopg.connect(outbox_db) as conn:
        open_letters = dead_letters.list_dead_letters(conn)
    counts = chaos.report(
        "outbox_poison_event",
        lost_events=1 - len({e.event_id for e in got}),
        duplicated_events=len(got) - len({e.event_id for e in got}),
        events_blocked_behind_poison=int(not sent[after]),
        dead_letters_left_after_retry=len(open_letters),
    )
    assert chaos.nonzero(counts) == {}


@pytest.mark.chaos
def test_the_relay_recovers_from_a_broker_restart_by_itself(outbox_db: str, tmp_path: Path) -> None:
    broker = OwnBroker(tmp_path)
    bootstrap = broker.bootstrap
    topics = TopicSpec(tuple(region_topics("r1") + region_topics("r2")), 3, 1)
    relay = OutboxRelay(outbox_db, bootstrap, topics=topics, message_timeout_ms=3000)
    stop = threading.Event()
    worker = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    worker.start()
    try:
        before = [enqueue_raw(outbox_db, event_payload(f"b{n}")) for n in range(20)]
        wait_sent(outbox_db, before, within=30)
        broker.kill()  # an in-memory broker: every producer id and topic gone
        during = [event_payload(f"d{n}") for n in range(50)]
        for p in during:
            enqueue_raw(outbox_db, p)
        # sleep is the behaviour under test: down past message_timeout_ms, messages expire
        time.sleep(4)
        broker.start()  # the same address, nothing in it
        wait_sent(outbox_db, [], within=60)
        got = read_topic(
            bootstrap,
            lifecycle_topic("r1"),
            expect=len(during),
            keep=lambda e: e.instance_id.startswith("d"),
            timeout=30,
        )
        meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
        ids = [str(e.event_id) for e in got]
        counts = chaos.report(
            "outbox_relay_broker_restart",
            lost_events=len({str(p["event_id"]) for p in during} - set(ids)),
            duplicated_events=len(ids) - len(set(ids)),
            topics_missing_or_misshapen=sum(
                1 for t in topics.names if t not in meta or len(meta[t].partitions) != 3
            ),
            processes_dead_after_recovery=int(not worker.is_alive()),
        )
        assert relay.progress.producers_recreated >= 1
        assert chaos.nonzero(counts) == {}
    finally:
        stop.set()
        worker.join(timeout=15)
        relay.close()
        broker.stop()


class OwnBroker(chaos.KillableService):
    """A tansu broker of the test's own, killed (SIGKILL: its in-memory state, producer
    ids, groups and topics gone) and started again on the same address."""

    def __init__(self, tmp_path: Path) -> None:
        self.bootstrap = f"127.0.0.1:{services.free_port()}"
        super().__init__(
            KafkaService(
                Settings(data_dir=tmp_path / "kafka", kafka={"bootstrap_servers": self.bootstrap})
            )
        )

    def freeze(self) -> None:
        """SIGSTOP: the broker holds every connection open and answers nothing."""
        os.killpg(self._record.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self._record.pid, signal.SIGCONT)


@contextmanager
def ledger_pipeline(
    outbox_db: str, broker: OwnBroker, tmp_path: Path, group: str
) -> Iterator[tuple[LedgerStore, list[threading.Thread]]]:
    """Outbox → relay → `broker` → ledger consumer (group `group`) → a ledger under
    `tmp_path`, relay and consumer in threads of their own; all closed afterwards, the
    broker stopped."""
    topics = TopicSpec(tuple(region_topics("r1")), 3, 1)
    ensure_topics(broker.bootstrap, topics.names, **topics.layout())
    stop = threading.Event()
    relay = OutboxRelay(outbox_db, broker.bootstrap, topics=topics, message_timeout_ms=3000)
    store = LedgerStore(f"chdb://{tmp_path / 'ledger'}")
    store.ensure_schema()
    consumer = LedgerConsumer(
        broker.bootstrap, topics.names, store, group_id=group, dead_letter_dsn=outbox_db
    )
    threads = [
        threading.Thread(target=relay.run, args=(stop,), daemon=True),
        threading.Thread(target=consumer.run, args=(stop,), daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        yield store, threads
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=15)
        relay.close()
        consumer.close()
        store.close()
        broker.stop()


@pytest.mark.chaos
def test_events_reach_the_ledger_across_a_broker_restart(outbox_db: str, tmp_path: Path) -> None:
    """Outbox → relay → Kafka → ledger consumer, the broker killed and restarted between
    two bursts of events: both processes carry on by themselves and the ledger gets every
    event once."""
    broker = OwnBroker(tmp_path)
    with ledger_pipeline(outbox_db, broker, tmp_path, "chaos") as (store, threads):
        first = [event_payload(f"l1-{n}") for n in range(20)]
        for p in first:
            enqueue_raw(outbox_db, p)
        wait_in_ledger(store, {str(p["event_id"]) for p in first}, within=60)
        broker.kill()
        second = [event_payload(f"l2-{n}") for n in range(20)]
        for p in second:
            enqueue_raw(outbox_db, p)
        time.sleep(4)  # sleep is the behaviour under test: the broker down past message_timeout_ms
        broker.start()
        expected = {str(p["event_id"]) for p in first + second}
        ledger = wait_in_ledger(store, expected, within=90)
        counts = chaos.report(
            "outbox_to_ledger_broker_restart",
            lost_events=len(expected - set(ledger)),
            duplicated_events=len(ledger) - len(set(ledger)),
            processes_dead_after_recovery=sum(1 for t in threads if not t.is_alive()),
        )
        assert chaos.nonzero(counts) == {}


@pytest.mark.chaos
def test_events_reach_the_ledger_across_a_frozen_broker(outbox_db: str, tmp_path: Path) -> None:
    """The broker frozen (SIGSTOP) under churn, then thawed. Time is compressed through the
    relay's settings: the freeze lasts past several message timeouts (3 s here; minutes in
    production) and past the consumer's 6 s session, so the producer's messages expire and
    the consumer group loses its member while frozen, as in a minutes-long freeze."""
    broker = OwnBroker(tmp_path)
    with ledger_pipeline(outbox_db, broker, tmp_path, "chaos-freeze") as (store, threads):
        frozen = False
        try:
            first = [event_payload(f"f1-{n}") for n in range(20)]
            for p in first:
                enqueue_raw(outbox_db, p)
            wait_in_ledger(store, {str(p["event_id"]) for p in first}, within=60)
            broker.freeze()
            frozen = True
            second = [event_payload(f"f2-{n}") for n in range(40)]
            for n, p in enumerate(second):  # churn goes on while the broker is frozen
                enqueue_raw(outbox_db, p)
                if n % 10 == 9:
                    time.sleep(1)  # sleep is the behaviour under test: churn spread over the freeze
            # sleep is the behaviour under test: frozen ~10 s, past 3 message timeouts, 6 s session
            time.sleep(6)
            broker.thaw()
            frozen = False
            expected = {str(p["event_id"]) for p in first + second}
            ledger = wait_in_ledger(store, expected, within=120)
            wait_sent(outbox_db, [], within=30)
            in_kafka = [
                str(e.event_id)
                for e in read_topic(
                    broker.bootstrap,
                    lifecycle_topic("r1"),
                    expect=len(expected),
                    keep=lambda e: str(e.event_id) in expected,
                    timeout=30,
                )
            ]
            counts = chaos.report(
                "outbox_to_ledger_broker_frozen",
                lost_events=len(expected - set(ledger)),
                lost_in_kafka=len(expected - set(in_kafka)),
                duplicated_events=len(ledger) - len(set(ledger)),
                processes_dead_after_recovery=sum(1 for t in threads if not t.is_alive()),
                # Not held to 0: messages the frozen broker had taken when their delivery timed
                # out are sent again by the new producer (at-least-once; the idempotent
                # producer cannot dedupe across producers). The ledger dedupes them by event id.
                kafka_copies_resent=len(in_kafka) - len(set(in_kafka)),
            )
            assert (
                chaos.nonzero({k: v for k, v in counts.items() if k != "kafka_copies_resent"}) == {}
            )
        finally:
            if frozen:
                broker.thaw()


def wait_in_ledger(store: LedgerStore, ids: set[str], *, within: float) -> list[str]:
    """The ledger's event ids (deduplicated as the ledger reads: FINAL) once all `ids` are
    there; fails past `within` seconds."""

    def all_there() -> list[str]:
        with store.session() as client:
            rows = client.query(f"SELECT toString(event_id) FROM {TABLE} FINAL").result_rows
        found = [str(r[0]) for r in rows if str(r[0]) in ids]
        assert ids <= set(found), f"{len(ids - set(found))} events not in the ledger"
        return found

    return eventually(
        all_there,
        timeout=within,
        what=f"{len(ids)} events in the ledger",
        every=0.5,
        retrying=AssertionError,  # a ledger error fails at once, as it did
    )


def wait_sent(dsn: str, ids: list[int], *, within: float) -> None:
    """Until the rows `ids` (every row when empty) are stamped sent."""
    with psycopg.connect(dsn, autocommit=True) as conn:

        def all_sent() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM outbox WHERE sent_at IS NULL "
                "AND (cardinality(%s::bigint[]) = 0 OR id = ANY(%s))",
                (ids, ids),
            ).fetchone()
            assert row is not None and row[0] == 0, f"{row} rows still unsent"
            return True

        eventually(
            all_sent,
            timeout=within,
            what=f"outbox rows {ids or 'all'} sent",
            every=0.2,
            retrying=AssertionError,  # a database error fails at once, as it did
        )
