"""Instance launches per minute through openstacksdk against the real test cloud.

    deploy/testcloud/up.sh
    OS_CLIENT_CONFIG_FILE=.sco/testcloud/clouds.yaml .venv/bin/python bench/openstack_bench.py \
        [--instances 20] [--pool r1.A.gp.l]

Creates N instances through OpenStackProvider (the idempotent create the activities use),
waits until all are ACTIVE, deletes them. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from activities.provider.interface import CreateRequest, InstanceStatus
from activities.provider.openstack import OpenStackProvider
from contracts.region import load_region


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=20)
    ap.add_argument("--pools", default="r1.A.gp.l,r1.B.gp.l,r1.C.gp.l,r1.D.gp.l")
    ap.add_argument("--image", default="sco-image")
    ap.add_argument("--network", default="none")
    args = ap.parse_args()
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
    started = time.perf_counter()
    created = await asyncio.gather(*(provider.create(r) for r in reqs))
    posted = time.perf_counter() - started
    pending = {c.provider_id for c in created}
    errors = 0
    while pending:
        for pid in list(pending):
            inst = await provider.get(pid)
            if inst.status in (InstanceStatus.ACTIVE, InstanceStatus.ERROR):
                errors += inst.status is InstanceStatus.ERROR
                pending.discard(pid)
        await asyncio.sleep(0.2)
    active = time.perf_counter() - started
    await asyncio.gather(*(provider.delete(c.provider_id) for c in created))
    print(
        json.dumps(
            {
                "instances": args.instances,
                "post_s": round(posted, 2),
                "all_active_s": round(active, 2),
                "launches_per_minute": round(args.instances / active * 60, 1),
                "errors": errors,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
