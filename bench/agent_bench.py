"""Node agent benchmark: reclaim notice published -> node cordoned and every workload told.

    .venv/bin/python bench/agent_bench.py [--notices 1000] [--nats nats://127.0.0.1:4222]

Prints one JSON object. Notices go through the machine's real NATS JetStream (a stream of
the bench's own, deleted after) into the real agent (dedupe store on disk, journal,
bounded workers, drain engine, checkpoint protocol over a real Unix socket). The scheduler
is the recording fake from tests/test_agent_fakes.py, so the figure excludes scontrol
(a real `scontrol update` and `scontrol requeue` add the Slurm controller's own latency,
not measured here). Each notice drains three workloads: two requeue jobs and one
checkpoint job whose in-process workload answers at once. Every notice is signed by the
relay's key (listed in the bundle), so the latency includes the agent's verification; the
cost of `notice_signing.check` alone is measured over the same number of notices. Then the
idle RSS of a real `python -m agent` process (NATS connected, nothing to do) is read from
/proc.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.checkpoint import register
from agent.daemon import Agent
from agent.natslink import NatsLink
from agent.scheduler import Workload
from agent.sources.nats import NatsNoticeSource
from contracts.bundle import BundleContent
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.notice import ReclaimNotice, notice_stream
from contracts.notice_signing import Accepted, NodeIdentity, check, sign
from tests.support.agent_fakes import RecordingScheduler, agent_config, notice_key, signed_bundle

NODE = "bench-node"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))], 2)


def bench_notice(region: str, i: int) -> ReclaimNotice:
    now = datetime.now(UTC)
    return ReclaimNotice(
        notice_id=f"bench-{i}",
        region=region,
        hall="D",
        node=NODE,
        pool_id="p",
        issued_at=now,
        deadline=now + timedelta(seconds=110),
    )


def verify_cost(n: int, region: str, content: BundleContent, tmp: Path) -> dict[str, object]:
    """Sign and check `n` notices in-process: microseconds per notice."""
    key = notice_key(tmp)
    notices = [bench_notice(region, i) for i in range(n)]
    started = time.perf_counter()
    signed = [sign(x, key) for x in notices]
    sign_us = (time.perf_counter() - started) / n * 1e6
    me = NodeIdentity(region, "D", NODE)
    now = datetime.now(UTC)
    started = time.perf_counter()
    results = [check(raw, content, me, now) for raw in signed]
    verify_us = (time.perf_counter() - started) / n * 1e6
    assert all(isinstance(r, Accepted) for r in results)
    return {"sign_us_per_notice": round(sign_us, 1), "verify_us_per_notice": round(verify_us, 1)}


async def latency(n: int, url: str, tmp: Path) -> dict[str, object]:
    region = f"b{uuid.uuid4().hex[:8]}"
    raw, trust, _ = signed_bundle(tmp, notice_regions=[region])
    held = BundleCache(tmp / "cache", TrustStore.load(trust)).offer(raw).bundle
    assert held is not None
    relay_key = notice_key(tmp)
    config = agent_config(tmp, node=NODE, region=region, nats_urls=[url], workers=2)
    told: list[float] = []

    def checkpoint_now(reason: str, deadline: float) -> str:
        told.append(time.monotonic())
        return "file:///ckpt"

    server = register(checkpoint_now, socket_path=config.socket_dir / "slurm-3.sock")
    scheduler = RecordingScheduler()
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name=notice_stream(region), subjects=[f"sco.{region}.notice.>"])
    link = NatsLink([url])
    source = NatsNoticeSource(link, region, "D", NODE)
    agent = Agent(config, scheduler=scheduler, sources=[source], link=link)
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    await asyncio.wait_for(source.watching.wait(), 10)
    to_cordon: list[float] = []
    to_all_told: list[float] = []
    try:
        for i in range(n):
            scheduler.workloads_on_node = [
                Workload(
                    id="1",
                    socket_name="slurm-1",
                    account="ci",
                    partition="spot",
                    comment="sco-contract=ci",
                ),
                Workload(
                    id="2",
                    socket_name="slurm-2",
                    account="ci",
                    partition="spot",
                    comment="sco-contract=ci",
                ),
                Workload(
                    id="3",
                    socket_name="slurm-3",
                    account="mlr",
                    partition="spot",
                    comment="sco-contract=llm-train",
                ),
            ]
            scheduler.calls.clear()
            told.clear()
            notice = bench_notice(region, i)
            agent.drained.clear()
            sent = time.monotonic()
            # Signing is the relay's work, but it is on the notice's path: timed too.
            await js.publish(notice.subject, sign(notice, relay_key))
            await asyncio.wait_for(agent.drained.wait(), 30)
            cordon_at = next(t for op, _, t in scheduler.calls if op == "cordon")
            requeue_at = [t for op, w, t in scheduler.calls if op == "requeue" and w in "12"]
            to_cordon.append((cordon_at - sent) * 1000)
            to_all_told.append((max([*requeue_at, *told]) - sent) * 1000)
    finally:
        stop.set()
        await run
        server.close()
        await js.delete_stream(notice_stream(region))
        await nc.close()
    return {
        "notices": n,
        "workloads_per_notice": 3,
        "scheduler": "recording fake (no scontrol); checkpoint over a real Unix socket",
        "notice_to_cordon_ms_p50": pct(to_cordon, 50),
        "notice_to_cordon_ms_p99": pct(to_cordon, 99),
        "notice_to_all_told_ms_p50": pct(to_all_told, 50),
        "notice_to_all_told_ms_p99": pct(to_all_told, 99),
        "notice_to_all_told_ms_max": round(max(to_all_told), 2),
        "notice_to_all_told_ms_mean": round(statistics.mean(to_all_told), 2),
        "target_p99_ms": 200,
        "notices_signed": True,
        "refused": len(agent.refusals),
        **verify_cost(n, region, held.content, tmp),
    }


def idle_rss(url: str, tmp: Path) -> dict[str, object]:
    config = tmp / "agent.toml"
    config.write_text(
        f'node_id = "{NODE}"\nregion = "bidle"\nhall = "D"\nscheduler = "none"\n'
        f'nats_urls = ["{url}"]\ncache_dir = "{tmp / "cache"}"\ntrust_dir = "{tmp / "trust"}"\n'
        f'journal_path = "{tmp / "idle" / "journal.jsonl"}"\nsocket_dir = "{tmp / "idle-s"}"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "--config", str(config), "--log-level", "WARNING"],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(3)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss_kb = int(next(x for x in status.splitlines() if x.startswith("VmRSS")).split()[1])
        started = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(30)
        stop_ms = (time.monotonic() - started) * 1000
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {
        "idle_rss_mb": round(rss_kb / 1024, 1),
        "target_idle_rss_mb": 40,
        "sigterm_exit_code": code,
        "sigterm_stop_ms": round(stop_ms, 1),
    }


def main() -> None:
    logging.basicConfig(level=logging.ERROR)  # the agent logs every drain at WARNING
    ap = argparse.ArgumentParser()
    ap.add_argument("--notices", type=int, default=1000)
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sco-agent-bench-"))
    result = asyncio.run(latency(args.notices, args.nats, tmp))
    result.update(idle_rss(args.nats, tmp))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
