"""Notices at hall scale: a hall-wide reclaim of --agents nodes at once, one real agent
process per node.

    .venv/bin/python bench/hall_fanout_bench.py [--agents 500] [--start-timeout 900]
        [--nats nats://127.0.0.1:4222] [--per-process 1] [--tiny]

Each node is its own agent (no-op scheduler, its own bundle cache, dedupe store, journal
and NATS consumer): its own `python -m agent` process, or with --per-process K, K real
agents on one event loop (bench/fanout_host.py; one agent process is ~50 MB, so 500 fit
in this machine's memory only packed) on the machine's NATS, in a region and hall named for this run
(so no other run's notices or consumers collide). The notice relay of the hall
(services/notice_relay/relay.py: its stream, signing and publish) publishes one signed notice
per node, one after another as its reclaim loop does; the bench stamps each publish with
the wall clock. Each agent's journal gives the drain start (the drain's finish time less
its duration) on the same clock: p50/p99 of publish -> drain start over all nodes, and the
relay's time to publish them all. Target p99 <= 200 ms.

How many agents fit: the first agent's RSS once it is watching, against MemAvailable
(at most half of it is used); agents are started in batches until --agents or the fit or
--start-timeout, whichever comes first, and the report says how many ran. Every wait is
bounded; a node not drained within --drain-timeout is a measurement that did not happen.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nats
from nats.js.client import JetStreamContext

from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository
from activities.provider.simulator import SimulatedCloud
from bench.report import Report
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.notice import ReclaimNotice, notice_stream
from contracts.region import load_region
from services.notice_relay.relay import NoticeRelay
from tests.support.agent_fakes import NOTICE_LEAD_SECONDS, notice_key, signed_bundle
from tests.support.paths import BASE_DSN
from workers import procstat

HALL = "H"
TARGET_P99_MS = 200.0
BATCH = 50


@dataclass
class Node:
    name: str
    journal: Path
    config: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))], 2)


def mem_available_mb() -> float:
    line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if "MemAvailable" in x)
    return int(line.split()[1]) / 1024


def node_config(tmp: Path, region: str, url: str, raw: bytes, trust: Path, i: int) -> Node:
    """Node i's own home: its bundle cache (the bundle checked against the trust dir, as a
    node holds it), config, dedupe store and journal; started by `start`."""
    name = f"n{i:04d}"
    home = tmp / name
    home.mkdir(parents=True)
    if not BundleCache(home / "cache", TrustStore.load(trust)).offer(raw).accepted:
        raise RuntimeError("the bench bundle was refused")
    config = home / "agent.toml"
    config.write_text(
        f'node_id = "{name}"\nregion = "{region}"\nhall = "{HALL}"\nscheduler = "none"\n'
        f'nats_urls = ["{url}"]\ncache_dir = "{home / "cache"}"\ntrust_dir = "{trust}"\n'
        f'journal_path = "{home / "journal.jsonl"}"\nsocket_dir = "{home / "sockets"}"\n'
    )
    return Node(name, home / "journal.jsonl", config)


def start(nodes: list[Node], log: Path) -> subprocess.Popen[bytes]:
    """One process for `nodes`: `python -m agent` for one, bench/fanout_host.py (the same
    Agent, several on one event loop) for more."""
    if len(nodes) == 1:
        cmd = [sys.executable, "-m", "agent", "--config", str(nodes[0].config)]
        cmd += ["--log-level", "WARNING"]
    else:
        cmd = [sys.executable, str(ROOT / "bench" / "fanout_host.py")]
        cmd += [str(n.config) for n in nodes]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out)
    for n in nodes:
        n.proc = proc
    return proc


async def watching(js: JetStreamContext, region: str) -> set[str]:
    """Nodes whose durable consumer has a subscriber bound (the agent is listening). The
    server lists consumers 256 at a time: page through them all."""
    seen: set[str] = set()
    offset = 0
    while page := await js.consumers_info(notice_stream(region), offset=offset):
        seen |= {c.name.removeprefix("sco-agent-") for c in page if c.push_bound}
        offset += len(page)
    return seen


async def until_watching(
    js: JetStreamContext, region: str, nodes: list[Node], deadline: float
) -> set[str]:
    want = {n.name for n in nodes if n.alive}
    while True:
        seen = await watching(js, region)
        if want <= seen or time.monotonic() > deadline:
            return seen & want
        await asyncio.sleep(0.5)


def drain_starts(node: Node) -> tuple[float | None, float | None]:
    """(notice received, drain start) wall-clock epoch seconds from the node's journal."""
    if not node.journal.is_file():
        return None, None
    received = start = None
    for line in node.journal.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "notice_received":
            received = datetime.fromisoformat(event["at"]).timestamp()
        if event.get("event") == "drain_finished" and event.get("finished_at"):
            done = datetime.fromisoformat(event["finished_at"]).timestamp()
            start = done - (event.get("finished_ms") or 0.0) / 1000
    return received, start


async def fanout(report: Report, args: argparse.Namespace, tmp: Path) -> None:
    region = f"hf{uuid.uuid4().hex[:8]}"
    raw, trust, _ = signed_bundle(tmp, notice_regions=[region])
    nc = await nats.connect(args.nats)
    js = nc.jetstream()
    # The hall's relay; publishing needs only its stream, key and JetStream, but it is
    # the relay object (fleet state is not read: the bench names the nodes itself).
    pool = open_pool(BASE_DSN, max_size=1, wait=False)
    relay = NoticeRelay(
        region=region,
        hall=HALL,
        lead=timedelta(seconds=NOTICE_LEAD_SECONDS),
        repo=FleetRepository(pool),
        provider=SimulatedCloud(load_region(ROOT / "deploy" / "regions" / "r1.toml")),
        js=js,
        signing_key=notice_key(tmp),
    )
    await relay.ensure_stream()
    nodes: list[Node] = []
    procs: list[subprocess.Popen[bytes]] = []
    anchor = "the relay's publish (wall clock) to the agent's drain start (its journal)"
    try:
        deadline = time.monotonic() + args.start_timeout
        per = max(1, args.per_process)

        def launch(count: int) -> list[Node]:
            batch = [
                node_config(tmp, region, args.nats, raw, trust, i)
                for i in range(len(nodes), len(nodes) + count)
            ]
            for k in range(0, len(batch), per):
                procs.append(start(batch[k : k + per], tmp / f"host{len(procs):04d}.log"))
            nodes.extend(batch)
            return batch

        await until_watching(js, region, launch(min(per, args.agents)), deadline)
        # Memory per agent: the first process's RSS over the agents it hosts.
        rss = (procstat.rss_mb(procs[0].pid) or 0.0) / len(nodes)
        fit = int(0.5 * mem_available_mb() / rss) if rss else args.agents
        want = min(args.agents, fit)
        while len(nodes) < want and time.monotonic() < deadline:
            batch = launch(min(want - len(nodes), max(BATCH, per)))
            up = await until_watching(js, region, batch, deadline)
            print(
                f"agents: {len(nodes)} started in {len(procs)} processes, "
                f"{len(up)} of the last batch watching",
                file=sys.stderr,
                flush=True,
            )
        ready = await until_watching(js, region, nodes, time.monotonic() + 5)
        live = [n for n in nodes if n.name in ready]
        rss_all = [r for p in procs if (r := procstat.rss_mb(p.pid)) is not None]
        report.details["agents"] = {
            "asked": args.agents,
            "fit_by_memory": fit,
            "started": len(nodes),
            "watching": len(live),
            "agents_per_process": per,
            "processes": len(procs),
            "rss_mb_per_agent_first": round(rss, 1),
            "rss_mb_total": round(sum(rss_all)),
            "mem_available_mb_after_start": round(mem_available_mb()),
        }
        if not live:
            report.measurement_missing(
                "publish_to_drain_start_p99",
                "no agent came up",
                "ms",
                anchor=anchor,
                target=TARGET_P99_MS,
                comparator="<=",
            )
            return
        # The hall-wide reclaim: one notice per node, published back to back.
        now = datetime.now(UTC)
        published: dict[str, float] = {}
        first = time.time()
        for n in live:
            notice = ReclaimNotice(
                notice_id=ReclaimNotice.stable_id(region, n.name, now),
                region=region,
                hall=HALL,
                node=n.name,
                pool_id=f"{region}.{HALL}.cpu.xl",
                issued_at=now,
                deadline=now + relay.lead,
                reason="hall-wide reclaim (bench)",
            )
            published[n.name] = time.time()
            await relay._publish(notice)
        publish_all_ms = (time.time() - first) * 1000
        end = time.monotonic() + args.drain_timeout
        starts: dict[str, tuple[float | None, float | None]] = {}
        while time.monotonic() < end:
            starts = {n.name: drain_starts(n) for n in live}
            if all(s is not None for _, s in starts.values()):
                break
            await asyncio.sleep(0.5)
        missing = [k for k, (_, s) in starts.items() if s is None]
        if missing:
            report.measurement_missing(
                "publish_to_drain_start_p99",
                f"{len(missing)}/{len(live)} nodes not drained within {args.drain_timeout:g} s",
                "ms",
                anchor=anchor,
                target=TARGET_P99_MS,
                comparator="<=",
            )
            return
        to_start = [(starts[k][1] or 0.0) - t for k, t in published.items()]
        to_received = [(starts[k][0] or 0.0) - t for k, t in published.items()]
        ms_start = [1000 * x for x in to_start]
        ms_received = [1000 * x for x in to_received]
        scale = f"{len(live)} agents, one per node, {per} per process on {os.cpu_count()} CPUs"
        report.figure("agents", len(live), "agents", anchor=f"asked {args.agents}; {scale}")
        report.figure("publish_to_drain_start_p50", pct(ms_start, 50), "ms", anchor=anchor)
        report.figure(
            "publish_to_drain_start_p99",
            pct(ms_start, 99),
            "ms",
            anchor=f"{anchor}; {scale}",
            target=TARGET_P99_MS,
            comparator="<=",
        )
        report.figure(
            "publish_to_received_p99",
            pct(ms_received, 99),
            "ms",
            anchor="the relay's publish to the agent's notice_received (verified, deduped)",
        )
        report.figure(
            "relay_publish_all",
            publish_all_ms,
            "ms",
            anchor=f"first publish to the last JetStream ack, {len(live)} signed notices",
        )
        report.details["publish_to_drain_start_ms_max"] = round(max(ms_start), 2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        await js.delete_stream(notice_stream(region))
        await nc.close()
        pool.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=500)
    ap.add_argument("--start-timeout", type=float, default=900.0, help="bound on start-up, s")
    ap.add_argument("--drain-timeout", type=float, default=60.0)
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    ap.add_argument(
        "--per-process",
        type=int,
        default=1,
        help="agents per process (bench/fanout_host.py): 500 of them fit in memory at 10",
    )
    ap.add_argument("--tiny", action="store_true", help="5 agents (CI smoke)")
    args = ap.parse_args()
    if args.tiny:
        args.agents, args.start_timeout, args.drain_timeout = 5, 45.0, 15.0
    report = Report(
        "hall_fanout",
        {
            "agents": args.agents,
            "per_process": args.per_process,
            "start_timeout_s": args.start_timeout,
        },
    )
    with tempfile.TemporaryDirectory(prefix="sco-fanout-") as tmp:
        asyncio.run(fanout(report, args, Path(tmp)))
    if (agents := report.details.get("agents")) and agents["watching"] < args.agents:
        report.notes.append(
            f"{agents['watching']} of {args.agents} agents ran "
            f"(memory fits {agents['fit_by_memory']}, start-up bound {args.start_timeout:g} s)"
        )
    return report.emit()


if __name__ == "__main__":
    raise SystemExit(main())
