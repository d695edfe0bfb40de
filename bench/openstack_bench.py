"""Instance launches per minute through openstacksdk against the real test cloud.

    deploy/testcloud/up.sh
    OS_CLIENT_CONFIG_FILE=.sco/testcloud/clouds.yaml .venv/bin/python bench/openstack_bench.py \
        [--instances 20] [--pools r1.A.gp.l,...] [--timeout 300] [--tiny]

Creates N instances through OpenStackProvider (the idempotent create the activities use),
waits until all are ACTIVE (at most --timeout seconds: the rest are a measurement that did
not happen), deletes them. No target is stated. Prints one JSON report (bench/report.py).
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

from activities.provider.interface import CreateRequest, InstanceStatus
from activities.provider.openstack import OpenStackProvider
from bench.report import Report
from contracts.region import load_region


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=20)
    ap.add_argument("--pools", default="r1.A.gp.l,r1.B.gp.l,r1.C.gp.l,r1.D.gp.l")
    ap.add_argument("--image", default="sco-image")
    ap.add_argument("--network", default="none")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--tiny", action="store_true", help="2 instances")
    args = ap.parse_args()
    if args.tiny:
        args.instances = 2
    report = Report("openstack", {"instances": args.instances, "pools": args.pools})
    region = load_region(ROOT / "deploy" / "regions" / "r1.toml")
    provider = OpenStackProvider.from_cloud("sco-testcloud", image=args.image, network=args.network)
    pools = args.pools.split(",")
    tag = uuid.uuid4().hex[:6]
    reqs = []
    for n in range(args.instances):
        pool = region.pool(pools[n % len(pools)])
        reqs.append(
            CreateRequest(
                name=f"sco-r1-bench{tag}-{n}",
                region="r1",
                pool_id=pools[n % len(pools)],
                hall=pool.hall,
                flavor=pool.flavor,
            )
        )
    anchor = f"{args.instances} concurrent creates through openstacksdk (Nova fake driver)"
    started = time.perf_counter()
    created = await asyncio.gather(*(provider.create(r) for r in reqs))
    posted = time.perf_counter() - started
    pending = {c.provider_id for c in created}
    errors = 0
    deadline = time.perf_counter() + args.timeout
    try:
        while pending and time.perf_counter() < deadline:
            for pid in list(pending):
                inst = await provider.get(pid)
                if inst.status in (InstanceStatus.ACTIVE, InstanceStatus.ERROR):
                    errors += inst.status is InstanceStatus.ERROR
                    pending.discard(pid)
            await asyncio.sleep(0.2)
        active = time.perf_counter() - started
    finally:
        await asyncio.gather(*(provider.delete(c.provider_id) for c in created))
    report.figure("post_all", posted, "s", anchor=anchor)
    if pending or errors:
        why = f"{len(pending)} not ACTIVE within {args.timeout} s, {errors} in ERROR"
        report.measurement_missing("launches_per_minute", why, "/min", anchor=anchor)
    else:
        report.figure(
            "launches_per_minute",
            args.instances / active * 60,
            "/min",
            anchor=anchor + ", all ACTIVE",
        )
    return report.emit()


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
