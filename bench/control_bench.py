"""Control-plane benchmark on Temporal's real dev server, real PostgreSQL, the signed
example bundle and the simulated cloud (in-process, so every create call is timestamped).

    .venv/bin/python bench/control_bench.py [--rate 10] [--backlog 600] [--trials 6]

demand_to_first_create: `demand set` (the fleet-state write plus the `demand_changed`
    signal, as `sco demand set` does) until the provider sees the first create call; the
    controller's tick is 60 s, so only the signal path can meet the 2 s target. Also timed
    once through the real `sco demand set` process (Python start-up included).
budget_utilisation: a backlog of acquisitions (`--backlog` instances) against a budget of
    `--rate` tokens/s: create calls per second in the steady window (after the first burst
    and before the backlog drains) divided by the rate. Target >= 95 %. Grants never exceed
    burst + rate x T (property-tested); calls *at the provider* can bunch a little behind
    the grants (task dispatch jitter), shown as max_in_any_1s_window.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.control.models import partition_of
from activities.fleet.control_state import ControlRepository
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from activities.provider.interface import CreateRequest, ProviderInstance
from activities.provider.simulator import SimulatedCloud
from contracts.region import load_region
from tests.support import services
from tests.support.control_harness import install_example_bundle, region_worker
from workers.temporal_bootstrap import bootstrap_namespace, ensure_search_attributes
from workflows.acquisition.models import AcquisitionInput, LaunchItem
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.controller.models import (
    ControllerConfig,
    ControllerInput,
    DemandChanged,
    controller_workflow_id,
)
from workflows.controller.workflow import RegionControllerWorkflow

BASE_DSN = os.environ.get("SCO_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


class TimedCloud(SimulatedCloud):
    """The simulated cloud, with the wall time of every successful create."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.create_times: list[float] = []

    async def create(self, request: CreateRequest) -> ProviderInstance:
        inst = await super().create(request)
        self.create_times.append(time.perf_counter())
        return inst


async def demand_latency(
    env: WorkflowEnvironment, dsn: str, trials: int, tmp: Path
) -> dict[str, object]:
    # The real ids in the real namespace, so `sco demand set` signals these controllers.
    address = env.client.service_client.config.target_host
    await bootstrap_namespace(env.client, "r1", timedelta(days=1))
    client = await Client.connect(address, namespace="r1", data_converter=pydantic_data_converter)
    region = load_region(ROOT / "deploy" / "regions" / "r1.toml")
    pool = open_pool(dsn, max_size=4)
    fleet, control = FleetRepository(pool), ControlRepository(pool)
    cache, trust = install_example_bundle(tmp / "bundle")
    cloud = TimedCloud(region, clock=time.monotonic)
    samples = []
    async with region_worker(client, cloud, fleet, control, bundle_dir=cache, trust_dir=trust) as h:
        contracts = ["spark-etl", "ci-runners", "search-api"]
        handles = {}
        for c in contracts:
            p = partition_of(c, 4)
            if p not in handles:
                handles[p] = await client.start_workflow(
                    RegionControllerWorkflow.run,
                    ControllerInput(
                        region="r1", partition=p, config=ControllerConfig(tick_seconds=60)
                    ),
                    id=controller_workflow_id("r1", p),
                    task_queue=h.queue,
                )
        await asyncio.sleep(2)  # first ticks (nothing demanded yet) are done
        for i in range(trials):
            c = contracts[i % len(contracts)]
            before = len(cloud.create_times)
            t0 = time.perf_counter()
            control.set_demand("r1", "cli", {c: 40 * (1 + i // len(contracts))})
            await handles[partition_of(c, 4)].signal(
                RegionControllerWorkflow.demand_changed, DemandChanged(contracts=[c])
            )
            for _ in range(400):
                if len(cloud.create_times) > before:
                    break
                await asyncio.sleep(0.005)
            if len(cloud.create_times) <= before:
                st = await handles[partition_of(c, 4)].query(RegionControllerWorkflow.status)
                raise SystemExit(f"no create within 2 s of demand for {c}: {st}")
            samples.append(cloud.create_times[before] - t0)
            await asyncio.sleep(1.0)
        # Once through the real CLI process: settings, bundle check, DB write, signal.
        c = "ci-runners"
        p = partition_of(c, 4)
        cli_env = {
            **os.environ,
            "SCO_POSTGRES_DSN": dsn,
            "SCO_TEMPORAL__ADDRESS": address,
            "SCO_TEMPORAL__NAMESPACE_PREFIX": "",
            "SCO_CONTRACTS__CACHE_DIR": str(cache),
            "SCO_CONTRACTS__TRUST_DIR": str(trust),
            "SCO_REGIONS_DIR": str(ROOT / "deploy" / "regions"),
        }
        before = len(cloud.create_times)
        t0 = time.perf_counter()
        cli_code, cli_out = await services.run_sco(
            cli_env, "demand", "set", c, "40", "--region", "r1", cwd=ROOT
        )
        for _ in range(400):
            if len(cloud.create_times) > before:
                break
            await asyncio.sleep(0.005)
        cli_seconds = cloud.create_times[before] - t0 if len(cloud.create_times) > before else -1.0
        for h_ in handles.values():
            await h_.terminate()
    pool.close()
    return {
        "trials": len(samples),
        "p50_s": round(statistics.median(samples), 3),
        "max_s": round(max(samples), 3),
        "target_s": 2.0,
        "via_sco_cli_process_s": round(cli_seconds, 3),
        "cli_exit_code": cli_code,
        "cli_output": cli_out.strip()[-300:],
    }


async def utilisation(
    env: WorkflowEnvironment, dsn: str, rate: float, backlog: int, tmp: Path
) -> dict[str, object]:
    region = load_region(ROOT / "deploy" / "regions" / "r1.toml")
    pool = open_pool(dsn, max_size=8)
    fleet, control = FleetRepository(pool), ControlRepository(pool)
    cloud = TimedCloud(region, clock=time.monotonic)
    burst = max(1, int(rate))
    pools = [region.pool_id(p) for p in region.pools if p.reclaimable_units >= 60 and not p.gpus][
        :10
    ]
    per_acq = 60
    async with region_worker(
        env.client,
        cloud,
        fleet,
        control,
        bundle_dir=tmp / "none",
        trust_dir=tmp / "none",
        rate_per_second=rate,
        burst=burst,
    ) as h:
        handles = []
        for i in range(backlog // per_acq):
            pid = pools[i % len(pools)]
            _, hall, sku, size = pid.split(".")
            handles.append(
                await env.client.start_workflow(
                    AcquisitionWorkflow.run,
                    AcquisitionInput(
                        region="r1",
                        contract=f"bench-{i}",
                        tier=3,
                        items=[
                            LaunchItem(
                                pool_id=pid,
                                hall=hall,
                                flavor=f"{sku}.{size}",
                                instances=per_acq,
                                units=per_acq,
                            )
                        ],
                    ),
                    id=f"acq-r1-bench-{i}-{uuid.uuid4().hex[:6]}",
                    task_queue=h.queue,
                )
            )
        for handle in handles:
            await handle.result()
    pool.close()
    times = sorted(cloud.create_times)
    # Steady window: skip the first burst's creates and the drain at the end.
    start, end = times[burst], times[-max(burst, 10)]
    steady = len([t for t in times if start <= t <= end]) - 1
    achieved = steady / (end - start)
    return {
        "rate_per_second": rate,
        "burst": burst,
        "instances": len(times),
        "acquisitions": len(handles),
        "steady_creates_per_second": round(achieved, 2),
        "utilisation_pct": round(100 * achieved / rate, 1),
        "max_in_any_1s_window": max(sum(1 for t in times if a <= t < a + 1.0) for a in times),
        "allowed_in_any_1s_window": burst + rate,
        "target_utilisation_pct": 95.0,
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--backlog", type=int, default=600)
    ap.add_argument("--trials", type=int, default=6)
    args = ap.parse_args()
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        data_converter=pydantic_data_converter,
        ui=False,
    )
    await ensure_search_attributes(env.client, env.client.namespace)
    region = load_region(ROOT / "deploy" / "regions" / "r1.toml")
    dbs = []
    try:
        out: dict[str, object] = {"machine_cpus": os.cpu_count()}
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("latency", "utilisation"):
                dsn = services.scratch_database(BASE_DSN)
                dbs.append(dsn)
                migrate(dsn)
                p = open_pool(dsn, max_size=1)
                FleetRepository(p).sync_pools(region)
                p.close()
                if name == "latency":
                    out["demand_to_first_create"] = await demand_latency(
                        env, dsn, args.trials, Path(tmp)
                    )
                else:
                    out["budget_utilisation"] = await utilisation(
                        env, dsn, args.rate, args.backlog, Path(tmp)
                    )
        print(json.dumps(out, indent=2))
    finally:
        for dsn in dbs:
            services.drop_database(dsn)
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
