"""Fleet state → outbox → relay → Kafka → ledger consumer → ClickHouse, end to end, and
replaying the topic into the ledger changes no total."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException

from activities.events import (
    CapacityType,
    EventKind,
    LifecycleEvent,
    lifecycle_topic,
    region_topics,
)
from activities.fleet import dead_letters
from activities.fleet.repository import FleetRepository, InstanceSpec
from activities.ledger import LedgerStore, reclaims_per_pool, spend
from contracts.region import Region
from services.ledger_consumer.consumer import LedgerConsumer
from services.outbox_relay.relay import OutboxRelay
from tests.support.kafka_read import messages_in
from tests.support.wait import WaitTimeout, eventually


def run_lifecycles(repo: FleetRepository, region: Region, prefix: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        iid = f"{prefix}-{i}"
        repo.record_acquire(
            InstanceSpec(
                instance_id=iid,
                region=region.id,
                pool_id=region.pool_ids()[i % 3],
                capacity_type=CapacityType.RECLAIMABLE,
                workload=f"{prefix}-wl{i % 2}",
                tier=2,
            )
        )
        repo.record_event(iid, EventKind.READY)
        ids.append(iid)
    # sleep is the behaviour under test: the instances accrue a measurable amount of time
    time.sleep(0.2)
    for iid in ids[: n // 2]:
        repo.record_event(iid, EventKind.NOTICE)
        repo.record_event(iid, EventKind.DELETE)
    return ids


def consume_all(bootstrap: str, store: LedgerStore, group: str) -> tuple[int, int, str]:
    """A new group reads r1's topics to their end as they are now: (messages read, messages
    there, what the group held at the end). The topics hold every test's events of this
    worker, some from databases other than this test's (tests/activities/test_outbox.py has
    its own), so it is Kafka's count that says when the group is at the end, not the
    outbox's. It gives up after 60 s in which nothing new was read (a group join and a
    rebalance under load take seconds each), or after 180 s in all."""
    there = messages_in(bootstrap, list(region_topics("r1")))
    consumer = LedgerConsumer(bootstrap, region_topics("r1"), store, group_id=group)
    start = last_progress = time.monotonic()
    seen = 0
    try:
        while consumer.progress.consumed < there:
            now = time.monotonic()
            if now - last_progress > 60 or now - start > 180:
                break
            consumer.poll_batch(timeout=0.5)
            if consumer.progress.consumed > seen:
                seen, last_progress = consumer.progress.consumed, time.monotonic()
        held = f"the group's lag per topic: {consumer.measure_lag()}"
    finally:
        consumer.close()
    return consumer.progress.consumed, there, held


def assert_read_to_the_end(read: int, there: int, held: str, *, total: int) -> None:
    assert there >= total, f"r1's topics hold {there} messages, fewer than {total} rows published"
    assert read >= there, f"the group read {read} of the {there} messages on r1's topics; {held}"


def test_replaying_the_topic_gives_the_same_spend(
    fleet_repo: FleetRepository,
    region_r1: Region,
    pg_dsn: str,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    prefix = f"lp-{uuid.uuid4().hex[:6]}"
    run_lifecycles(fleet_repo, region_r1, prefix, 20)
    stop = threading.Event()
    relay = OutboxRelay(pg_dsn, kafka_bootstrap, idle_poll_seconds=0.05)
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    with psycopg.connect(pg_dsn) as conn:
        # r1's rows only: the worker's session database holds other tests' rows of other
        # regions too, which the r1 consumer below never reads (it came up 85 of 89 short).
        total = int(
            conn.execute(  # type: ignore[index]
                "SELECT count(*) FROM outbox WHERE topic = ANY(%s)", (list(region_topics("r1")),)
            ).fetchone()[0]
        )
    try:
        eventually(
            lambda: relay.progress.published >= total,
            timeout=120,
            what=f"all {total} outbox rows published",
        )
    finally:
        stop.set()
        thread.join(10)

    store = LedgerStore(f"chdb://{tmp_path / 'ledger'}")
    end = datetime.now(UTC) + timedelta(minutes=1)
    start = end - timedelta(hours=1)

    def totals() -> tuple[list[tuple[str | None, float]], list[tuple[str, int]]]:
        rows = [
            r for r in spend(store, start=start, end=end) if (r.workload or "").startswith(prefix)
        ]
        rec = [(r.pool_id, r.reclaims) for r in reclaims_per_pool(store, start=start, end=end)]
        return [(r.workload, round(r.spend, 12)) for r in rows], rec

    read, there, held = consume_all(kafka_bootstrap, store, f"ledger-{prefix}-a")
    assert_read_to_the_end(read, there, held, total=total)
    first = totals()
    assert len(first[0]) == 2 and all(s > 0 for _, s in first[0])
    assert sum(n for _, n in first[1]) >= 10
    # A second consumer group replays the whole topic into the same ledger.
    read, there, held = consume_all(kafka_bootstrap, store, f"ledger-{prefix}-b")
    assert_read_to_the_end(read, there, held, total=total)
    assert totals() == first
    store.close()


@pytest.mark.parametrize("payload", [b"not json", b'{"kind": "ready"}'])
def test_a_malformed_event_is_a_dead_letter_not_fatal(
    kafka_bootstrap: str, tmp_path: Path, payload: bytes, pg_dsn: str
) -> None:
    from confluent_kafka import Producer

    topic = lifecycle_topic("r3")
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    key = uuid.uuid4().hex.encode()
    producer.produce(topic, key=key, value=payload)
    producer.flush(10)
    store = LedgerStore(f"chdb://{tmp_path / 'ledger'}")
    consumer = LedgerConsumer(
        kafka_bootstrap, [topic], store, group_id=uuid.uuid4().hex, dead_letter_dsn=pg_dsn
    )

    def ours() -> list[dead_letters.DeadLetter]:
        with psycopg.connect(pg_dsn) as conn:
            return [d for d in dead_letters.list_dead_letters(conn) if d.key == key.decode()]

    # The topic is shared: other cases' malformed events may come first, so wait for ours.
    deadline = time.monotonic() + 30
    try:
        while not ours() and time.monotonic() < deadline:
            consumer.poll_batch(timeout=0.5)
    finally:
        consumer.close()
        store.close()
    assert consumer.progress.malformed >= 1
    assert consumer.progress.dead_lettered == consumer.progress.malformed
    mine = ours()
    assert [(d.source, d.topic, d.value) for d in mine] == [("ledger", topic, payload)]
    assert mine[0].reason.startswith("unparsable: ") and mine[0].location.startswith(topic)


def test_a_decision_reaches_the_ledger_through_the_outbox(
    fleet_repo: FleetRepository, pg_dsn: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    from activities.decisions import Decision, DecisionKind, decisions_topic
    from activities.fleet.control_state import ControlRepository
    from activities.ledger import decisions

    control = ControlRepository(fleet_repo._pool)
    decision = Decision(
        region="r1",
        kind=DecisionKind.FALLBACK,
        subject=f"dec-{uuid.uuid4().hex[:6]}",
        outcome="declined",
        actor="deadline",
        amount_per_hour=3.5,
    )
    assert control.record_decision(decision)
    assert not control.record_decision(decision)  # a retried activity writes nothing new
    stop = threading.Event()
    relay = OutboxRelay(pg_dsn, kafka_bootstrap, idle_poll_seconds=0.05)
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    store = LedgerStore(f"chdb://{tmp_path / 'ledger'}")
    consumer = LedgerConsumer(
        kafka_bootstrap, [decisions_topic("r1")], store, group_id=uuid.uuid4().hex
    )
    found: list[Decision] = []
    deadline = time.monotonic() + 60
    try:
        while not found and time.monotonic() < deadline:
            consumer.poll_batch(timeout=0.5)
            found = decisions(
                store,
                start=decision.occurred_at - timedelta(minutes=1),
                end=decision.occurred_at + timedelta(minutes=1),
                subject=decision.subject,
            )
    finally:
        consumer.close()
        stop.set()
        thread.join(10)
    assert len(found) == 1 and found[0].outcome == "declined" and found[0].actor == "deadline"


def _group_state(consumer: LedgerConsumer) -> str:
    """The new client's assignment, committed offsets and watermarks (what a wait that
    read nothing after a renewal needs to say; the test reads the consumer's own client)."""
    client = consumer._consumer
    assigned = client.assignment()
    committed = {f"{tp.topic}[{tp.partition}]": tp.offset for tp in client.committed(assigned, 10)}
    marks = {
        f"{tp.topic}[{tp.partition}]": client.get_watermark_offsets(tp, timeout=5)
        for tp in assigned
    }
    return f"assigned {len(assigned)}, committed {committed}, watermarks {marks}"


def _publish_ready(producer: Any, topic: str, region: str, instance_id: str, workload: str) -> None:
    """One READY event of `instance_id` on `topic`, flushed."""
    event = LifecycleEvent(
        kind=EventKind.READY, instance_id=instance_id, region=region,
        pool_id=f"{region}.A.gp.l", hall="A", sku="gp", size="l",
        capacity_type=CapacityType.RECLAIMABLE, workload=workload, tier=2,
        price_per_hour=0.1,
    )  # fmt: skip
    producer.produce(topic, key=event.instance_id.encode(), value=event.model_dump_json())
    producer.flush(10)


@contextlib.contextmanager
def _running(consumer: LedgerConsumer) -> Iterator[Callable[[], None]]:
    """`consumer.run` on a thread of its own; yields `halt` (stop it and wait), also
    called on the way out."""
    stop = threading.Event()
    runner = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    runner.start()

    def halt() -> None:
        stop.set()
        runner.join(timeout=30)

    try:
        yield halt
    finally:
        halt()


@pytest.mark.timeout(330)  # above its waits: 60 + 30 + 150 s
def test_a_renewed_client_certificate_gets_a_new_kafka_client_and_nothing_is_lost(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """librdkafka reads its certificate files only when a client is made: when the files
    change (a renewal), the consumer makes a new client between batches and goes on from
    the committed offsets (decision 0036)."""
    from confluent_kafka import Producer

    from services.ledger_consumer import consumer as consumer_module

    monkeypatch.setattr(consumer_module, "RENEWAL_EVERY_SECONDS", 0.2)
    topic = lifecycle_topic("r2")
    cert = tmp_path / "client.crt"
    cert.write_text("first certificate\n")
    store = LedgerStore(f"chdb://{tmp_path / 'ledger'}")
    consumer = LedgerConsumer(
        kafka_bootstrap, [topic], store, group_id=uuid.uuid4().hex, renew_on_change=[cert]
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    workload = f"renewal-{uuid.uuid4().hex[:8]}"
    try:
        with _running(consumer) as halt:
            _publish_ready(producer, topic, "r2", f"{workload}-1", workload)
            eventually(lambda: consumer.progress.inserted >= 1, timeout=60, what="the first event")
            cert.write_text("the renewed certificate, longer\n")
            eventually(lambda: consumer.renewals == 1, timeout=30, what="a new Kafka client")
            _publish_ready(producer, topic, "r2", f"{workload}-2", workload)
            # 150 s: under load the new member once had no partition after 60 s (tansu's
            # coordinator; 23 runs alone beside 2 CPU hogs took 9-13 s). Whether it is
            # late or never comes, the failure says, with the client's group state.
            try:
                eventually(
                    lambda: consumer.progress.inserted >= 2, timeout=150, what="the second event"
                )
            except WaitTimeout as exc:
                halt()
                state = f"{_group_state(consumer)}, last poll ok: {consumer.healthy}"
                raise AssertionError(f"{exc}; the new client: {state}") from None
    finally:
        consumer.close()
        store.close()
    assert consumer.renewals == 1


class _RefusesOneCommit:
    """A Kafka consumer whose first batch commit is refused (a broker restarting)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.refused = 0

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        if "offsets" not in kwargs and not self.refused:
            self.refused += 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return self._client.commit(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_renewal_after_a_refused_commit_hands_the_new_client_its_place(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old client commits where it read before it goes: the new one neither reads the
    topic again from its start nor skips what came while it joined."""
    from confluent_kafka import Consumer, Producer

    from activities.kafka import ensure_topics
    from services.ledger_consumer import consumer as consumer_module

    monkeypatch.setattr(consumer_module, "RENEWAL_EVERY_SECONDS", 0.2)
    region = f"t{uuid.uuid4().hex[:8]}"
    topic = lifecycle_topic(region)
    ensure_topics(kafka_bootstrap, [topic], partitions=1, replication_factor=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    # Before the group's first read: read once, never again.
    _publish_ready(producer, topic, region, f"{region}-0", region)
    made: list[_RefusesOneCommit] = []

    def first_refuses(config: dict[str, Any]) -> Any:
        client = Consumer(config)
        if made:
            return client
        made.append(_RefusesOneCommit(client))
        return made[0]

    monkeypatch.setattr(consumer_module, "Consumer", first_refuses)
    cert = tmp_path / "client.crt"
    cert.write_text("first certificate\n")
    store = LedgerStore(f"chdb://{tmp_path / 'ledger'}")
    consumer = LedgerConsumer(
        kafka_bootstrap, [topic], store, group_id=uuid.uuid4().hex, renew_on_change=[cert]
    )
    try:
        with _running(consumer):
            _publish_ready(producer, topic, region, f"{region}-1", region)
            eventually(lambda: consumer.progress.consumed >= 2, timeout=60, what="both read")
            eventually(lambda: made[0].refused == 1, timeout=30, what="the commit refused")
            cert.write_text("the renewed certificate, longer\n")
            eventually(lambda: consumer.renewals == 1, timeout=30, what="a new Kafka client")
            _publish_ready(producer, topic, region, f"{region}-2", region)
            eventually(lambda: consumer.progress.consumed >= 3, timeout=60, what="the third")
            # sleep is the behaviour under test: a re-read from the start would come now
            time.sleep(1)
    finally:
        consumer.close()
        store.close()
    assert consumer.progress.consumed == 3, "the new client read the topic again"


@pytest.mark.timeout(180)
def test_the_consumer_counts_each_time_it_lets_a_held_ledger_go(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A held embedded ledger is closed between batches for a process that waits for it
    (a CLI query): each such reopen is what steps the consumer's memory up (chDB keeps
    ~2 MB of each open), so each is counted and logged. The worker's reclaim-rate reads are
    answered on the holder's socket (as `sco ledger consume` serves them) and cost none."""
    from prometheus_client import REGISTRY

    from activities.ledger import reclaim_rate
    from activities.ledger.holder import HolderSocket
    from tests.support.ledger_reader import read_elsewhere

    def released() -> float:
        return REGISTRY.get_sample_value("sco_ledger_engine_releases_total") or 0.0

    dsn = f"chdb://{tmp_path / 'ledger'}"
    store = LedgerStore(dsn, hold=True)
    store.ensure_schema()
    consumer = LedgerConsumer(
        kafka_bootstrap, [lifecycle_topic("r3")], store, group_id=uuid.uuid4().hex
    )
    before = released()
    stop = threading.Event()
    loop = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    loop.start()
    reads = HolderSocket(store)
    assert reads.start()
    try:
        worker = LedgerStore(dsn, lock_timeout=5, reads_in_child=True)
        end = datetime.now(UTC)
        for _ in range(3):
            reclaim_rate(worker, pool_ids=["r3-A"], start=end - timedelta(hours=1), end=end)
        assert reads.answered["rates"] == 3 and consumer.engine_releases == 0
        assert read_elsewhere(dsn, "SELECT 1") == ["1"]
        eventually(lambda: consumer.engine_releases == 1, timeout=30, what="the release counted")
        assert released() == before + 1
    finally:
        stop.set()
        loop.join(timeout=30)
        reads.close()
        consumer.close()
        store.close()
