"""Ledger consumer soak: the RSS of `sco ledger consume` (embedded chDB) under churn.

Real processes: a tansu broker of its own, the ledger consumer as an operator runs it
(`python -m workers.cli ledger consume`, its own process, a chDB ledger in a temp dir),
this process producing lifecycle events to Kafka, and now and then a separate process
reading the ledger as `sco ledger ...` does (it waits for the ledger, so the consumer lets
its held engine go and opens it again). The consumer's VmRSS and RssAnon are sampled from
/proc all along; the curve is in `details.curve` (and a PNG with --png when matplotlib is
installed).

Over `ledger.recycle_rss_mb` of VmRSS (--recycle-mb) the consumer restarts
itself (exec, same pid): `details.restarts_of_itself` counts those.

Time is compressed by count, not by clock: an hour of light churn is taken to be 3,600
consumer batches of 3 events (one every second) and 60 ledger reads (one a minute); the
full run makes exactly those, a batch every ~0.2 s instead of every second and the reads
in between, so it lasts minutes, not an hour. Memory that grows per batch, per event or per
reopen is reproduced one to one; memory that grows with wall time alone (none seen) would
not be. --tiny: 100 batches and 1 read.

    .venv/bin/python bench/ledger_soak_bench.py [--tiny] [--batches 3600] [--reads 60]
        [--png bench/results/ledger_soak_rss.png] [--timeout 1800]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer

from activities.events import (
    EventKind,
    lifecycle_topic,
    region_topics,
)
from activities.kafka import ensure_topics
from activities.ledger.store import TABLE, LedgerStore
from bench.report import Report
from tests.support import services
from tests.support.ledger_events import cpu_event
from workers import procstat
from workers.devbox import process
from workers.devbox.services import KafkaService
from workers.settings import Settings

EVENTS_PER_BATCH = 3
TARGET_RSS_MB = 400.0

# A reader as `sco ledger` is: its own process, waits for the lock, counts, lets go.
READER = """
import sys
from activities.ledger.store import LedgerStore, TABLE
with LedgerStore(sys.argv[1], lock_timeout=60) as store, store.session() as c:
    print(c.query(f"SELECT count() FROM {TABLE} FINAL").result_rows[0][0])
"""


def event(n: int) -> bytes:
    return (
        cpu_event(
            f"soak-{n // 2}",
            kind=EventKind.READY if n % 2 else EventKind.ACQUIRE,
            workload="bench",
        )
        .model_dump_json()
        .encode()
    )


def ledger_count(dsn: str) -> int:
    with LedgerStore(dsn) as store, store.session() as client:
        return int(client.query(f"SELECT count() FROM {TABLE} FINAL").result_rows[0][0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batches", type=int, default=3600)
    ap.add_argument("--reads", type=int, default=60)
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument(
        "--recycle-mb",
        type=int,
        default=None,
        help="the consumer's ledger.recycle_rss_mb (default: the setting's)",
    )
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    batches, reads = (100, 1) if args.tiny else (args.batches, args.reads)
    report = Report(
        "ledger_soak",
        {
            "batches": batches,
            "events_per_batch": EVENTS_PER_BATCH,
            "reads": reads,
            "tiny": args.tiny,
            "hour_equivalent": "3600 batches of 3 events + 60 reads (1 batch/s, 1 read/min)",
            "recycle_rss_mb": args.recycle_mb,
        },
    )
    with tempfile.TemporaryDirectory(prefix="sco-soak-") as tmp_s:
        tmp = Path(tmp_s)
        bootstrap = f"127.0.0.1:{services.free_port()}"
        broker = KafkaService(
            Settings(data_dir=tmp / "kafka", kafka={"bootstrap_servers": bootstrap})
        )
        record = broker.start()
        try:
            run(report, tmp, bootstrap, batches, reads, args.timeout, args.png, args.recycle_mb)
        finally:
            process.stop(record)
    return report.emit()


def run(
    report: Report,
    tmp: Path,
    bootstrap: str,
    batches: int,
    reads: int,
    timeout: float,
    png: Path | None,
    recycle_mb: int | None,
) -> None:
    topics = [t for r in ("r1", "r2", "r3") for t in region_topics(r)]
    ensure_topics(bootstrap, topics, partitions=3, replication_factor=1)
    dsn = f"chdb://{tmp / 'ledger'}"
    env = {
        **os.environ,
        "SCO_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "SCO_LEDGER_DSN": dsn,
        "SCO_DATA_DIR": str(tmp / "data"),
        "PYTHONPATH": str(ROOT),
    }
    if recycle_mb is not None:
        env["SCO_LEDGER__RECYCLE_RSS_MB"] = str(recycle_mb)
    log = (tmp / "consumer.log").open("wb")
    consumer = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "ledger", "consume"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    curve: list[dict[str, float]] = []
    started = time.monotonic()
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0) and consumer.poll() is None:
            mem = procstat.memory_mb(consumer.pid)
            if not mem:  # the consumer is gone
                return
            curve.append({"t_s": round(time.monotonic() - started, 1), "sent": sent[0], **mem})

    sent = [0]
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    topic = lifecycle_topic("r1")
    read_every = max(1, batches // max(1, reads))
    reads_done = 0
    read_seconds: list[float] = []
    deadline = started + timeout
    try:
        n = 0
        for b in range(batches):
            for _ in range(EVENTS_PER_BATCH):
                producer.produce(topic, key=f"soak-{n // 2}", value=event(n))
                n += 1
            producer.flush(10)
            sent[0] = n
            # One batch each: the next events go once the consumer took these (or 1 s).
            time.sleep(0.2)
            if reads and (b + 1) % read_every == 0 and reads_done < reads:
                t0 = time.monotonic()
                subprocess.run(
                    [sys.executable, "-c", READER, dsn],
                    cwd=ROOT,
                    env=env,
                    check=True,
                    capture_output=True,
                    timeout=120,
                )
                read_seconds.append(time.monotonic() - t0)
                reads_done += 1
            if time.monotonic() > deadline or consumer.poll() is not None:
                break
        # Until the ledger has every event: read as a CLI would (the consumer lets go).
        while time.monotonic() < deadline and consumer.poll() is None:
            if ledger_count(dsn) >= sent[0]:
                break
            time.sleep(2)
    finally:
        stop.set()
        sampler.join(timeout=5)
        alive = consumer.poll() is None
        consumer.terminate()
        try:
            consumer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            consumer.kill()
        log.close()
    in_ledger = ledger_count(dsn)
    report.details["restarts_of_itself"] = (
        (tmp / "consumer.log").read_text().count("restarting itself")
    )
    anchor = "VmRSS of the `sco ledger consume` process, /proc/<pid>/status"
    if not curve or not alive:
        reason = "consumer died" if not alive else "no sample"
        report.measurement_missing(
            "rss_end", reason, "MB", anchor=anchor, target=TARGET_RSS_MB, comparator="<="
        )
        report.details["consumer_log"] = (tmp / "consumer.log").read_text()[-3000:]
        return
    last = curve[-1]
    # The end is the last tenth of the run, at its highest: a sample taken while the
    # consumer restarts itself (exec) would read near zero.
    tail = curve[-max(1, len(curve) // 10) :]
    loaded = next((c for c in curve if c["RssFile"] > 200), curve[0])  # the engine is in
    report.figure(
        "rss_end",
        max(c["VmRSS"] for c in tail),
        "MB",
        anchor=anchor + ", highest in the run's last tenth",
        target=TARGET_RSS_MB,
        comparator="<=",
    )
    report.figure("rss_peak", max(c["VmRSS"] for c in curve), "MB", anchor=anchor)
    anon_end = max(c["RssAnon"] for c in tail)
    report.figure("rss_anon_end", anon_end, "MB", anchor="RssAnon, highest in the last tenth")
    report.figure(
        "rss_anon_growth",
        anon_end - loaded["RssAnon"],
        "MB",
        anchor="RssAnon at the end less at the first sample with the engine loaded",
    )
    report.figure(
        "events_missing_from_ledger",
        float(sent[0] - in_ledger),
        "events",
        anchor="events produced less the ledger's count (FINAL)",
        target=0,
        comparator="==",
    )
    if read_seconds:
        report.figure(
            "read_wait_max",
            max(read_seconds),
            "s",
            anchor="a reader process's start to its answer (includes Python and chDB start)",
        )
    # About 60 samples keep the JSON short; the PNG has them all.
    report.details["curve"] = [*curve[:: max(1, len(curve) // 60)], last]
    report.notes.append(
        "RssFile is the chDB library's mapped pages (~320 MB, shared and reclaimable); "
        "RssAnon is what the process allocated."
    )
    if png is not None:
        plot(curve, png, report)


def plot(curve: list[dict[str, Any]], png: Path, report: Report) -> None:
    try:
        import matplotlib
    except ImportError:
        report.notes.append("no PNG: matplotlib is not installed (the plots extra)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([c["t_s"] for c in curve], [c["VmRSS"] for c in curve], label="VmRSS")
    ax.plot([c["t_s"] for c in curve], [c["RssAnon"] for c in curve], label="RssAnon")
    ax.axhline(TARGET_RSS_MB, linestyle="--", color="grey", label="target")
    ax.set_xlabel("seconds (an hour of churn, compressed by count)")
    ax.set_ylabel("MB")
    ax.legend()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100, bbox_inches="tight")
    report.details["png"] = str(png)


if __name__ == "__main__":
    sys.exit(main())
