"""Outbox benchmark: relay throughput, and latency from state commit to ledger row.

Runs against real services: the machine's PostgreSQL (a scratch database on
tests/support/paths.BASE_DSN), a tansu broker of its own, an embedded chDB ledger in a temp
dir. Prints one JSON report (bench/report.py). No target is stated for either figure.

    .venv/bin/python bench/outbox_bench.py [--events 20000] [--rate 200] [--seconds 10]
        [--tiny] [--timeout 120]

Every wait is bounded by --timeout: a relay or consumer that stops is a figure not
measured (and exit 1), not a hung bench.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.events import CapacityType, EventKind, lifecycle_topic
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository, InstanceSpec
from activities.ledger import LedgerStore
from bench.report import Report
from contracts.region import load_region
from services.ledger_consumer.consumer import LedgerConsumer
from services.outbox_relay.relay import OutboxRelay
from tests.support import services
from tests.support.paths import BASE_DSN, REGIONS_DIR
from workers.devbox import process
from workers.devbox.services import KafkaService
from workers.settings import Settings

REGION_FILE = REGIONS_DIR / "r1.toml"


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


def wait_for(done: Callable[[], bool], timeout: float, step: float) -> bool:
    """Poll `done` until it holds or `timeout` seconds pass; whether it held."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20000, help="backlog for the throughput run")
    ap.add_argument("--rate", type=float, default=200, help="state changes/s, latency run")
    ap.add_argument("--seconds", type=float, default=10, help="length of the latency run")
    ap.add_argument("--timeout", type=float, default=120, help="bound on every wait")
    ap.add_argument("--tiny", action="store_true", help="400 events, 1 s at 50/s (CI smoke)")
    args = ap.parse_args()
    if args.tiny:
        args.events, args.rate, args.seconds, args.timeout = 400, 50.0, 1.0, 30.0
    report = Report(
        "outbox",
        {"events": args.events, "rate_per_s": args.rate, "seconds": args.seconds, "batch": 2000},
    )
    tp_anchor = f"a committed backlog of {args.events} events; relay start to last publish"
    lat_anchor = f"each event's commit (steady {args.rate:g}/s) to its ledger row's inserted_at"

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
    stop, cstop = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []
    try:
        # 1. Throughput: drain a backlog of committed events.
        fill(repo, pools, "tp", args.events)
        relay = OutboxRelay(dsn, bootstrap, batch_size=2000)
        started = time.perf_counter()
        threads.append(threading.Thread(target=relay.run, args=(stop,), daemon=True))
        threads[-1].start()
        if not wait_for(lambda: relay.progress.published >= args.events, args.timeout, 0.01):
            why = f"relay published {relay.progress.published}/{args.events} in {args.timeout} s"
            report.measurement_missing("relay_throughput", why, "events/s", anchor=tp_anchor)
            report.measurement_missing("commit_to_ledger_p99", why, "ms", anchor=lat_anchor)
            return report.emit()
        report.figure(
            "relay_throughput",
            args.events / (time.perf_counter() - started),
            "events/s",
            anchor=tp_anchor,
        )

        # 2. Latency: steady writes; relay and ledger consumer running; commit → ledger row.
        store = LedgerStore(f"chdb://{tmp / 'ledger'}")
        store.ensure_schema()
        consumer = LedgerConsumer(
            bootstrap, [lifecycle_topic("r1")], store, group_id=f"bench-{uuid.uuid4().hex}"
        )
        threads.append(threading.Thread(target=consumer.run, args=(cstop,), daemon=True))
        threads[-1].start()
        # Catch up with the backlog first, so the latency run starts from an idle pipeline.
        if not wait_for(lambda: consumer.progress.inserted >= args.events, args.timeout, 0.05):
            why = (
                f"ledger consumer inserted {consumer.progress.inserted}/{args.events} of the "
                f"backlog in {args.timeout} s"
            )
            report.measurement_missing("commit_to_ledger_p99", why, "ms", anchor=lat_anchor)
            return report.emit()
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
        arrived = wait_for(lambda: consumer.progress.inserted >= target, args.timeout, 0.05)
        cstop.set()
        stop.set()
        for t in threads:
            t.join(10)
        consumer.close()
        with store.session() as client:
            rows = client.query(
                "SELECT toString(event_id), toUnixTimestamp64Milli(inserted_at) "
                "FROM lifecycle_events FINAL WHERE instance_id LIKE 'lat-%'"
            ).result_rows
        store.close()
        latencies = [row[1] / 1000 - committed_at[row[0]] for row in rows if row[0] in committed_at]
        report.details.update(
            {
                "latency_written": n,
                "achieved_rate_per_s": round(n / args.seconds, 1),
                "latency_in_ledger": len(latencies),
            }
        )
        if not arrived or len(latencies) < n:
            report.measurement_missing(
                "commit_to_ledger_p99",
                f"{len(latencies)}/{n} events reached the ledger within {args.timeout} s",
                "ms",
                anchor=lat_anchor,
            )
            return report.emit()
        # The rate the writes reached, not the rate asked for: a loaded machine writes slower.
        lat_anchor = (
            f"each event's commit to its ledger row's inserted_at; {n} events at "
            f"{n / args.seconds:.0f}/s (asked {args.rate:g}/s)"
        )
        report.figure(
            "commit_to_ledger_p50", statistics.median(latencies) * 1000, "ms", anchor=lat_anchor
        )
        report.figure(
            "commit_to_ledger_p99", percentile(latencies, 0.99) * 1000, "ms", anchor=lat_anchor
        )
        return report.emit()
    finally:
        stop.set()
        cstop.set()
        pool.close()
        process.stop(broker)
        services.drop_database(dsn)


if __name__ == "__main__":
    raise SystemExit(main())
