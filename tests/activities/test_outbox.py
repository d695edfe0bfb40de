"""Outbox: a state change and its event commit together; the relay delivers every event,
in per-instance order, across a broker outage."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

import psycopg
import pytest

from activities.events import CapacityType, EventKind, lifecycle_topic
from activities.fleet.repository import FleetRepository, InstanceSpec
from contracts.region import Region
from services.outbox_relay.relay import OutboxRelay
from tests.support import fleet_db
from tests.support.kafka_read import read_topic
from tests.support.wait import eventually
from workers.devbox.process import ProcessRecord

LIFECYCLE = [EventKind.READY, EventKind.NOTICE, EventKind.DRAIN, EventKind.DELETE]
EXPECTED_KINDS = ["acquire", *(k.value for k in LIFECYCLE)]


def write_changes(
    repo: FleetRepository,
    region: Region,
    prefix: str,
    instances: int,
    written: list[int],
    stop: threading.Event,
) -> list[str]:
    """`instances` x 5 state changes, interleaved across instances like a real fleet;
    `written[0]` counts the events written, and `stop` ends the writing early (a failed
    test must not leave it writing into the module's database under the next test)."""
    ids = [f"{prefix}-{n:05d}" for n in range(instances)]
    pools = region.pool_ids()
    for n, iid in enumerate(ids):
        if stop.is_set():
            return ids
        repo.record_acquire(
            InstanceSpec(
                instance_id=iid,
                region=region.id,
                pool_id=pools[n % len(pools)],
                capacity_type=CapacityType.RECLAIMABLE,
                workload="ci-runners",
                tier=3,
            )
        )
        written[0] += 1
    for kind in LIFECYCLE:
        for iid in ids:
            if stop.is_set():
                return ids
            repo.record_event(iid, kind)
            written[0] += 1
    return ids


@pytest.fixture(scope="module")
def outbox_db(region_r1: Region) -> Iterator[tuple[str, FleetRepository]]:
    """A database of the module's own, and a repository on it: its 10,000 lifecycle events
    (2,000 NOTICEs across r1's pools) would otherwise count in every later test's pool
    state on this worker (the exclusion safety net reads NOTICEs from the outbox)."""
    with (
        fleet_db.migrated_scratch_database() as dsn,
        fleet_db.fleet_repository(dsn, region_r1, max_size=4) as repo,
    ):
        yield dsn, repo


def unsent(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone()
    return int(row[0]) if row else -1


# 10,000 writes, an outage and the backlog read back: ~50 s on a quiet machine, over
# 120 s for the first half alone beside the suite and two CPU hogs (`make test-under-load`).
@pytest.mark.timeout(900)
def test_ten_thousand_changes_survive_a_broker_outage(
    outbox_db: tuple[str, FleetRepository],
    region_r1: Region,
    kafka_bootstrap: str,
    tansu: ProcessRecord,
) -> None:
    outbox_dsn, outbox_repo = outbox_db
    prefix = f"ob-{uuid.uuid4().hex[:8]}"
    instances = 2000  # x 5 changes each = 10,000 events
    stop = threading.Event()
    relay = OutboxRelay(outbox_dsn, kafka_bootstrap, batch_size=1000, idle_poll_seconds=0.05)
    relay_thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    relay_thread.start()

    written = [0]
    stop_writing = threading.Event()
    writer = threading.Thread(
        target=write_changes,
        args=(outbox_repo, region_r1, prefix, instances, written, stop_writing),
    )
    writer.start()
    try:
        eventually(lambda: written[0] >= 5000, timeout=300, what="half the changes written")
        os.kill(tansu.pid, signal.SIGSTOP)  # broker unreachable: tansu is memory-only
        try:
            eventually(lambda: not writer.is_alive(), timeout=300, what="every change written")
            # sleep is the behaviour under test: the broker stays unreachable while it relays
            time.sleep(3)
            backlog_during_outage = unsent(outbox_dsn)
        finally:
            os.kill(tansu.pid, signal.SIGCONT)
        assert backlog_during_outage > 0, "the outage should have held events back"
        eventually(lambda: unsent(outbox_dsn) == 0, timeout=120, what="the outbox backlog sent")
        assert unsent(outbox_dsn) == 0
    finally:
        stop_writing.set()
        writer.join(30)
        stop.set()
        relay_thread.join(30)

    with psycopg.connect(outbox_dsn) as conn:
        committed = {
            str(r[0])
            for r in conn.execute(
                "SELECT event_id FROM outbox WHERE key LIKE %s", (f"{prefix}-%",)
            ).fetchall()
        }
    assert len(committed) == instances * 5

    seen = read_topic(
        kafka_bootstrap,
        lifecycle_topic("r1"),
        expect=len(committed),
        keep=lambda e: e.instance_id.startswith(prefix),
    )
    # A consumer that dedupes by event id sees each event exactly once, none missing.
    first_seen: dict[str, object] = {}
    per_instance: dict[str, list[str]] = defaultdict(list)
    for event in seen:
        key = str(event.event_id)
        if key in first_seen:
            continue
        first_seen[key] = event
        per_instance[event.instance_id].append(event.kind.value)
    assert set(first_seen) == committed
    assert len(per_instance) == instances
    assert all(kinds == EXPECTED_KINDS for kinds in per_instance.values())


def test_pruning_removes_only_sent_rows_past_retention(
    outbox_db: tuple[str, FleetRepository], region_r1: Region, kafka_bootstrap: str
) -> None:
    outbox_dsn, outbox_repo = outbox_db
    relay = OutboxRelay(outbox_dsn, kafka_bootstrap, retention_hours=0)
    with psycopg.connect(outbox_dsn) as conn:
        while relay.publish_batch(conn):
            pass
        sent_before = conn.execute(
            "SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL"
        ).fetchone()
        conn.commit()
        prefix = f"pr-{uuid.uuid4().hex[:8]}"
        outbox_repo.record_acquire(
            InstanceSpec(
                instance_id=prefix,
                region="r1",
                pool_id=region_r1.pool_ids()[0],
                capacity_type=CapacityType.RECLAIMABLE,
                workload="ci-runners",
                tier=3,
            )
        )
        assert sent_before is not None
        assert relay.prune(conn) == sent_before[0]
        left = conn.execute("SELECT key, sent_at FROM outbox").fetchall()
    assert left == [(prefix, None)]  # the unsent event stays
