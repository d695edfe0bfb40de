"""Simulator benchmark: 10,000 instances, and calls per second per core.

    .venv/bin/python bench/simulator_bench.py [--instances 10000] [--service-calls 5000]
        [--tiny] [--timeout 300]

In-process: creates, gets, lists and deletes against SimulatedCloud. Service: the same
CloudProvider calls over NATS request-reply (the machine's NATS), 32 in flight. "Per core"
divides by the CPU seconds the benchmark process used (the service runs in-process here,
so both ends are counted). The service run is bounded by --timeout (each call by the
client's own 10 s). Prints one JSON report (bench/report.py); no target is stated.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nats

from activities.provider.interface import CreateRequest
from activities.provider.sim_service import SimulatorClient, serve
from activities.provider.simulator import SimulatedCloud
from bench.report import Report
from contracts.region import load_region


def requests(region_file: Path, n: int) -> tuple[SimulatedCloud, list[CreateRequest]]:
    region = load_region(region_file)
    # r1 lends ~4,500 instances; scale every pool so the benchmark can hold `n`.
    total = sum(p.reclaimable_units for p in region.pools)
    scale = max(1, -(-n // total))
    doc = region.model_dump()
    for pool in doc["pools"]:
        pool["reclaimable_units"] *= scale
    region = type(region).model_validate(doc)
    cloud = SimulatedCloud(region, clock=time.monotonic)
    slots = [(region.pool_id(p), p) for p in region.pools for _ in range(p.reclaimable_units)]
    if len(slots) < n:
        raise SystemExit(f"{region.id} can lend only {len(slots)} instances")
    reqs = [
        CreateRequest(name=f"sco-r1-b{i}", region="r1", pool_id=pid, hall=p.hall, flavor=p.flavor)
        for i, (pid, p) in enumerate(slots[:n])
    ]
    return cloud, reqs


async def in_process(n: int) -> dict[str, float]:
    cloud, reqs = requests(ROOT / "deploy" / "regions" / "r1.toml", n)
    cpu, wall = time.process_time(), time.perf_counter()
    ids = [(await cloud.create(r)).provider_id for r in reqs]
    for pid in ids:
        await cloud.get(pid)
    listed = len(await cloud.list_owned("r1"))
    for pid in ids:
        await cloud.delete(pid)
    calls = 3 * n + 1
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert listed == n
    return {
        "instances": n,
        "calls": calls,
        "calls_per_s": round(calls / wall),
        "calls_per_cpu_s": round(calls / cpu),
    }


async def service(n: int, bound_s: float) -> dict[str, float]:
    cloud, reqs = requests(ROOT / "deploy" / "regions" / "r1.toml", n)
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    nc = await nats.connect("nats://127.0.0.1:4222")
    server = asyncio.create_task(serve(cloud, nc, prefix=prefix))
    await asyncio.sleep(0.05)
    client = SimulatorClient("nats://127.0.0.1:4222", "r1", prefix=prefix)
    sem = asyncio.Semaphore(32)

    async def create(r: CreateRequest) -> str:
        async with sem:
            return (await client.create(r)).provider_id

    cpu, wall = time.process_time(), time.perf_counter()
    try:
        ids = await asyncio.wait_for(asyncio.gather(*(create(r) for r in reqs)), bound_s)
    finally:
        server.cancel()
        await client.close()
        await nc.close()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert len(set(ids)) == n
    return {
        "calls": n,
        "calls_per_s": round(n / wall),
        "calls_per_cpu_s": round(n / cpu),
        "in_flight": 32,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=10000)
    ap.add_argument("--service-calls", type=int, default=5000)
    ap.add_argument("--timeout", type=float, default=300, help="bound on the service run")
    ap.add_argument("--tiny", action="store_true", help="300 instances, 200 calls (CI smoke)")
    args = ap.parse_args()
    if args.tiny:
        args.instances, args.service_calls, args.timeout = 300, 200, 30.0
    report = Report("simulator", {"instances": args.instances, "service_calls": args.service_calls})
    local = asyncio.run(in_process(args.instances))
    anchor = f"{args.instances} creates + gets + deletes and one list, in-process"
    report.figure("in_process_calls_per_s", local["calls_per_s"], "calls/s", anchor=anchor)
    report.figure(
        "in_process_calls_per_cpu_s", local["calls_per_cpu_s"], "calls/CPU-s", anchor=anchor
    )
    sanchor = f"{args.service_calls} creates over NATS request-reply, 32 in flight"
    try:
        remote = asyncio.run(service(args.service_calls, args.timeout))
    except (TimeoutError, AssertionError) as exc:
        why = f"service run did not complete within {args.timeout} s: {exc!r}"
        report.measurement_missing("over_nats_calls_per_s", why, "calls/s", anchor=sanchor)
        return report.emit()
    report.figure("over_nats_calls_per_s", remote["calls_per_s"], "calls/s", anchor=sanchor)
    report.figure(
        "over_nats_calls_per_cpu_s",
        remote["calls_per_cpu_s"],
        "calls/CPU-s",
        anchor=sanchor + "; both ends in this process",
    )
    report.details.update({"in_process": local, "over_nats": remote})
    return report.emit()


if __name__ == "__main__":
    raise SystemExit(main())
