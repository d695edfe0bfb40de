"""Outbox benchmark: relay throughput, and latency from state commit to ledger row.

Runs against real services: the machine's PostgreSQL (a scratch database), a tansu
broker of its own, an embedded chDB ledger in a temp dir. Prints one JSON object.

    .venv/bin/python bench/outbox_bench.py [--events 20000] [--rate 500] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from tests.support.paths import REGIONS_DIR

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.events import CapacityType, EventKind, lifecycle_topic
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.relay import OutboxRelay
from activities.fleet.repository import FleetRepository, InstanceSpec
from activities.ledger import LedgerStore
from activities.ledger.consumer import LedgerConsumer
from contracts.region import load_region
from tests.support import services
from workers.devbox import process
from workers.devbox.services import KafkaService
from workers.settings import Settings

REGION_FILE = REGIONS_DIR / "r1.toml"
BASE_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def bench_spec(iid: str, pools: list[str], n: int) -> InstanceSpec:
    return InstanceSpec(
        instance_id=iid,
        region="r1",
        pool_id=pools[n % len(pools)],
        capacity_type=CapacityType.RECLAIMABLE,
        workload="bench",
        tier=3,
    )


def fill(repo: FleetRepository, pools: list[str], prefix: str, events: int) -> None:
    """`events` committed state changes (acquire + ready per instance)."""
    for n in range(events // 2):
        iid = f"{prefix}-{n}"
        repo.record_acquire(bench_spec(iid, pools, n))
        repo.record_event(iid, EventKind.READY)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20000, help="backlog for the throughput run")
    ap.add_argument("--rate", type=float, default=200, help="state changes/s, latency run")
    ap.add_argument("--seconds", type=float, default=10, help="length of the latency run")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="sco-bench-"))
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    port = services.free_port()
    kafka = KafkaService(Settings(data_dir=tmp, kafka={"bootstrap_servers": f"127.0.0.1:{port}"}))
    broker = kafka.start()
    kafka.prepare()
    bootstrap = f"127.0.0.1:{port}"
    pool = open_pool(dsn, max_size=4)
    repo = FleetRepository(pool)
    region = load_region(REGION_FILE)
    repo.sync_pools(region)
    pools = region.pool_ids()
    try:
        # 1. Throughput: drain a backlog of committed events.
        fill(repo, pools, "tp", args.events)
        relay = OutboxRelay(dsn, bootstrap, batch_size=2000)
        stop = threading.Event()
        started = time.perf_counter()
        thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
        thread.start()
        while relay.progress.published < args.events:
            time.sleep(0.01)
        throughput = args.events / (time.perf_counter() - started)

        # 2. Latency: steady writes; relay and ledger consumer running; commit → ledger row.
        store = LedgerStore(f"chdb://{tmp / 'ledger'}")
        store.ensure_schema()
        consumer = LedgerConsumer(
            bootstrap, [lifecycle_topic("r1")], store, group_id=f"bench-{uuid.uuid4().hex}"
        )
        cstop = threading.Event()
        cthread = threading.Thread(target=consumer.run, args=(cstop,), daemon=True)
        cthread.start()
        while consumer.progress.inserted < args.events:  # catch up with the backlog first
            time.sleep(0.05)
        committed_at: dict[str, float] = {}
        interval = 1.0 / args.rate
        deadline = time.monotonic() + args.seconds
        n = 0
        while time.monotonic() < deadline:
            iid = f"lat-{n}"
            event = repo.record_acquire(bench_spec(iid, pools, n))
            assert event is not None
            committed_at[str(event.event_id)] = time.time()
            n += 1
            time.sleep(max(0.0, interval - 0.0005))
        target = args.events + n
        wait_until = time.monotonic() + 60
        while consumer.progress.inserted < target and time.monotonic() < wait_until:
            time.sleep(0.05)
        cstop.set()
        stop.set()
        cthread.join(10)
        thread.join(10)
        consumer.close()
        with store.session() as client:
            rows = client.query(
                "SELECT toString(event_id), toUnixTimestamp64Milli(inserted_at) "
                "FROM lifecycle_events FINAL WHERE instance_id LIKE 'lat-%'"
            ).result_rows
        store.close()
        latencies = [row[1] / 1000 - committed_at[row[0]] for row in rows if row[0] in committed_at]
        print(
            json.dumps(
                {
                    "relay_throughput_events_per_s": round(throughput, 1),
                    "throughput_backlog_events": args.events,
                    "latency_events": len(latencies),
                    "latency_written": n,
                    "commit_to_ledger_p50_ms": round(statistics.median(latencies) * 1000, 1),
                    "commit_to_ledger_p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
                    "latency_rate_per_s": args.rate,
                    "relay_batch_size": 2000,
                },
                indent=2,
            )
        )
    finally:
        pool.close()
        process.stop(broker)
        services.drop_database(dsn)


if __name__ == "__main__":
    main()
