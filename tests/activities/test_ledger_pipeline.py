"""Fleet state → outbox → relay → Kafka → ledger consumer → ClickHouse, end to end, and
replaying the topic into the ledger changes no total."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

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
from tests.support.wait import eventually


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


def consume_all(bootstrap: str, store: LedgerStore, group: str, until: int) -> int:
    consumer = LedgerConsumer(bootstrap, region_topics("r1"), store, group_id=group)
    deadline = time.monotonic() + 60
    try:
        while consumer.progress.inserted < until and time.monotonic() < deadline:
            consumer.poll_batch(timeout=0.5)
    finally:
        consumer.close()
    return consumer.progress.inserted


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

    assert consume_all(kafka_bootstrap, store, f"ledger-{prefix}-a", total) >= total
    first = totals()
    assert len(first[0]) == 2 and all(s > 0 for _, s in first[0])
    assert sum(n for _, n in first[1]) >= 10
    # A second consumer group replays the whole topic into the same ledger.
    assert consume_all(kafka_bootstrap, store, f"ledger-{prefix}-b", total) >= total
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

    def publish(n: int) -> None:
        event = LifecycleEvent(
            kind=EventKind.READY, instance_id=f"{workload}-{n}", region="r2",
            pool_id="r2.A.gp.l", hall="A", sku="gp", size="l",
            capacity_type=CapacityType.RECLAIMABLE, workload=workload, tier=2,
            price_per_hour=0.1,
        )  # fmt: skip
        producer.produce(topic, key=event.instance_id.encode(), value=event.model_dump_json())
        producer.flush(10)

    stop = threading.Event()
    runner = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    runner.start()
    try:
        publish(1)
        eventually(lambda: consumer.progress.inserted >= 1, timeout=60, what="the first event")
        cert.write_text("the renewed certificate, longer\n")
        eventually(lambda: consumer.renewals == 1, timeout=30, what="a new Kafka client")
        publish(2)
        eventually(lambda: consumer.progress.inserted >= 2, timeout=60, what="the second event")
    finally:
        stop.set()
        runner.join(timeout=30)
        consumer.close()
        store.close()
    assert consumer.renewals == 1
