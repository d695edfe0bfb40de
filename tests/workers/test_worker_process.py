"""The region worker as operators run it: `sco worker` in its own process against the dev
server, with its health and metrics endpoints, driven by `sco demand set` and read with
`sco acquisitions list` / `sco controller status`; SIGTERM shuts it down gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import IO

import nats
import pytest
from temporalio.testing import WorkflowEnvironment

from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from activities.provider.sim_service import serve
from activities.provider.simulator import SimulatedCloud
from contracts.region import Region
from tests.support import services
from tests.support.control_harness import install_example_bundle
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO
from tests.support.wait import WaitTimeout, eventually_async
from tests.support.worker_nats import NATS_URL
from workers.temporal_bootstrap import bootstrap_namespace


@pytest.fixture
def worker_db(region_r1: Region) -> Iterator[str]:
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    pool = open_pool(dsn, max_size=1)
    FleetRepository(pool).sync_pools(region_r1)
    pool.close()
    yield dsn
    services.drop_database(dsn)


@pytest.fixture
async def sim_prefix(region_r1: Region) -> AsyncIterator[str]:
    prefix = f"wp{uuid.uuid4().hex[:8]}"
    cloud = SimulatedCloud(region_r1, clock=asyncio.get_running_loop().time)
    nc = await nats.connect(NATS_URL)
    task = asyncio.create_task(serve(cloud, nc, prefix=prefix))
    yield prefix
    task.cancel()
    await nc.close()


def spawn_worker(env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "worker", "--region", "r1"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


async def _status_is(url: str, status: int) -> bool:
    return (await asyncio.to_thread(get, url))[0] == status


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


async def sco(env: dict[str, str], *args: str) -> tuple[int, str]:
    return await services.run_sco(env, *args, cwd=REPO)


async def test_worker_serves_health_metrics_and_the_operator_commands(
    dev_server_env: WorkflowEnvironment, worker_db: str, sim_prefix: str, tmp_path: Path
) -> None:
    ns_prefix = f"wp-{uuid.uuid4().hex[:6]}-"
    address = dev_server_env.client.service_client.config.target_host
    await bootstrap_namespace(dev_server_env.client, f"{ns_prefix}r1", timedelta(days=1))
    cache, trust = install_example_bundle(tmp_path / "contracts")
    health, metrics = services.free_port(), services.free_port()
    env = {
        **os.environ,
        "SCO_TEMPORAL__ADDRESS": address,
        "SCO_TEMPORAL__NAMESPACE_PREFIX": ns_prefix,
        "SCO_POSTGRES_DSN": worker_db,
        "SCO_PROVIDER__SIMULATOR_PREFIX": sim_prefix,
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_DATA_DIR": str(tmp_path / "data"),
        "SCO_LEDGER_DSN": "chdb://memory",
        "SCO_CONTRACTS__CACHE_DIR": str(cache),
        "SCO_CONTRACTS__TRUST_DIR": str(trust),
        "SCO_WORKER__HEALTH_PORT": str(health),
        "SCO_WORKER__METRICS_PORT": str(metrics),
        # 0: its default (9465) is one port for every xdist worker's region worker
        "SCO_WORKER__STATE_METRICS_PORT": "0",
        "SCO_WORKER__GRACEFUL_SHUTDOWN_SECONDS": "5",
    }
    log = (tmp_path / "worker.log").open("wb")
    worker = spawn_worker(env, log)
    try:
        await eventually_async(
            lambda: _status_is(f"http://127.0.0.1:{health}/readyz", 200),
            timeout=90,
            what="the worker ready",
            every=0.1,
        )
        assert get(f"http://127.0.0.1:{health}/healthz")[0] == 200
        assert get(f"http://127.0.0.1:{health}/readyz")[0] == 200

        code, out = await sco(env, "demand", "set", "no-such-contract", "5", "--region", "r1")
        assert code == 1 and "not in bundle" in out
        code, out = await sco(env, "demand", "set", "ci-runners", "24", "--region", "r1")
        assert code == 0 and "signalled controller-r1-p" in out, out

        rows: list[dict[str, object]] = []

        async def completed() -> bool:
            nonlocal rows
            code, out = await sco(
                env,
                "acquisitions",
                "list",
                "--all",
                "--region",
                "r1",
                "--contract",
                "ci-runners",
                "--json",
            )
            rows = json.loads(out) if code == 0 else []
            return bool(rows) and all(r["state"] == "completed" for r in rows)

        with contextlib.suppress(WaitTimeout):  # the assertions below say what was there
            await eventually_async(
                completed, timeout=120, what="every ci-runners acquisition completed", retrying=()
            )
        assert rows and rows[0]["contract"] == "ci-runners", rows
        assert sum(int(str(r["acquired"])) for r in rows) >= 1
        # Completed ones' units come from their result (the close event), not a query.
        assert all(r["units_requested"] is not None for r in rows), rows
        assert sum(int(str(r["units_acquired"])) for r in rows) >= 1, rows
        code, out = await sco(env, "acquisitions", "show", str(rows[0]["id"]), "--region", "r1")
        assert code == 0 and "completed" in out
        code, out = await sco(env, "controller", "status", "--region", "r1", "--json")
        assert code == 0 and any(
            isinstance(x, dict) and x["acquisitions_started"] >= 1 for x in json.loads(out)
        )
        code, out = await sco(
            env, "acquisitions", "cancel", str(rows[0]["id"]), "--region", "r1", "--by", "eve"
        )
        assert code == 1 and "error" in out  # finished: refused with a reason
        # One reconciler pass, dry run: the acquisition's instances are all known.
        code, out = await sco(env, "reconcile", "--region", "r1", "--dry-run", "--json")
        assert code == 0, out
        report = json.loads(out)
        assert report["dry_run"] and report["passes"] == 1 and report["orphan_servers"] == []
        code, out = await sco(env, "reconcile", "--region", "r1")
        assert code == 0 and "agree" in out, out

        status, body = get(f"http://127.0.0.1:{metrics}/metrics")
        assert status == 200 and "sco_instances_acquired" in body
        assert "temporal_workflow_completed" in body or "workflow_completed" in body
    finally:
        worker.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):  # asserted below
            await asyncio.to_thread(worker.wait, 60)
        stopped = worker.poll()
        log.close()
    assert stopped == 0, (tmp_path / "worker.log").read_text()[-2000:]
