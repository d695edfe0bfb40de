"""Every operator action is a ledger decision: who (`--by`), why, when.

One test performs each action with the real `sco` command against a real `sco worker` (dev
server, scratch PostgreSQL, its own NATS with JetStream, the simulated cloud), a real
`sco notice-relay`, then carries the outbox through Kafka (tansu) into the ledger and finds
each action's decision there. Each command that names a workflow prints its Temporal UI
link, and the worker and relay, writing to a file, log one JSON object per line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

import nats
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.budget import budget_workflow_id
from activities.control.models import partition_of
from activities.decisions import Decision, decisions_topic
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from activities.ledger import LedgerStore, decisions
from activities.lifecycle.models import lifecycle_workflow_id
from activities.provider.sim_service import serve
from activities.provider.simulator import SimulatedCloud
from contracts import keys
from contracts.compiler import compile_and_sign
from contracts.region import Region
from services.ledger_consumer.consumer import LedgerConsumer
from services.outbox_relay.relay import OutboxRelay
from tests.support import services
from tests.support.control_harness import fallback_above_authority, install_example_bundle
from tests.support.paths import BASE_DSN, EXAMPLES, REGIONS_DIR, REPO
from tests.support.wait import eventually_async
from workers.devbox import process
from workers.devbox.services import NatsService
from workers.settings import ControlSettings, Settings
from workers.temporal_bootstrap import bootstrap_namespace
from workflows.acquisition.models import AcquisitionInput, AcquisitionProgress, FallbackState
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.controller.models import controller_workflow_id
from workflows.exclusion.models import exclusion_workflow_id

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def audit_db(region_r1: Region) -> Iterator[str]:
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    pool = open_pool(dsn, max_size=1)
    FleetRepository(pool).sync_pools(region_r1)
    pool.close()
    yield dsn
    services.drop_database(dsn)


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[str]:
    """A NATS server of this test's own, so publishing a bundle and answering reclaims
    touch no other test's buckets or subjects."""
    url = f"nats://127.0.0.1:{services.free_port()}"
    record = NatsService(Settings(nats_url=url, data_dir=tmp_path / "nats")).start()
    yield url
    process.stop(record)


@pytest.fixture
async def sim_prefix(region_r1: Region, own_nats: str) -> AsyncIterator[str]:
    prefix = f"au{uuid.uuid4().hex[:8]}"
    cloud = SimulatedCloud(region_r1, clock=asyncio.get_running_loop().time)
    nc = await nats.connect(own_nats)
    task = asyncio.create_task(serve(cloud, nc, prefix=prefix))
    yield prefix
    task.cancel()
    await nc.close()


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def spawn(env: dict[str, str], log: IO[bytes], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


async def waiting_for_approval(client: Client, wid: str, contract: str) -> str:
    handle = await client.start_workflow(
        AcquisitionWorkflow.run,
        AcquisitionInput(
            region="r1", contract=contract, tier=2, fallback=fallback_above_authority(contract)
        ),
        id=wid,
        task_queue="sco-r1",
    )

    async def awaiting() -> bool:
        p: AcquisitionProgress = await handle.query(AcquisitionWorkflow.progress)
        return p.fallback is FallbackState.AWAITING_APPROVAL

    await eventually_async(
        awaiting, timeout=60, what=f"{wid} waiting for approval", every=0.1, retrying=()
    )
    return wid


def ledger_decisions(dsn: str, bootstrap: str, store: LedgerStore, want: int) -> list[Decision]:
    """Relay the outbox to Kafka and consume it into the ledger until `want` operator
    decisions of this test are there (or a minute passed)."""
    stop_relay = threading.Event()
    relay = OutboxRelay(dsn, bootstrap, idle_poll_seconds=0.05)
    thread = threading.Thread(target=relay.run, args=(stop_relay,), daemon=True)
    thread.start()
    consumer = LedgerConsumer(bootstrap, [decisions_topic("r1")], store, group_id=uuid.uuid4().hex)
    now = datetime.now(UTC)
    found: list[Decision] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            consumer.poll_batch(timeout=0.5)
            found = decisions(store, start=now - timedelta(hours=1), end=now + timedelta(hours=1))
            if len([d for d in found if d.actor != "sco"]) >= want:
                break
    finally:
        consumer.close()
        stop_relay.set()
        thread.join(10)
    return found


async def test_every_operator_action_is_a_ledger_decision(
    dev_server_env: WorkflowEnvironment,
    audit_db: str,
    own_nats: str,
    sim_prefix: str,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    ns_prefix = f"au-{uuid.uuid4().hex[:6]}-"
    address = dev_server_env.client.service_client.config.target_host
    await bootstrap_namespace(dev_server_env.client, f"{ns_prefix}r1", timedelta(days=1))
    client = await Client.connect(
        address, namespace=f"{ns_prefix}r1", data_converter=pydantic_data_converter
    )
    cache, trust = install_example_bundle(tmp_path / "contracts")
    health = services.free_port()
    env = {
        **os.environ,
        "SCO_TEMPORAL__ADDRESS": address,
        "SCO_TEMPORAL__NAMESPACE_PREFIX": ns_prefix,
        "SCO_POSTGRES_DSN": audit_db,
        "SCO_NATS_URL": own_nats,
        "SCO_PROVIDER__SIMULATOR_PREFIX": sim_prefix,
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_DATA_DIR": str(tmp_path / "data"),
        "SCO_LEDGER_DSN": "chdb://memory",
        "SCO_CONTRACTS__CACHE_DIR": str(cache),
        "SCO_CONTRACTS__TRUST_DIR": str(trust),
        "SCO_NOTICES__SIGNING_KEY_FILE": str(keys.generate(tmp_path / "notice-keys")[1]),
        "SCO_WORKER__HEALTH_PORT": str(health),
        "SCO_WORKER__METRICS_PORT": "0",
        # 0: its default (9465) is one port for every xdist worker's region worker
        "SCO_WORKER__STATE_METRICS_PORT": "0",
        "SCO_WORKER__GRACEFUL_SHUTDOWN_SECONDS": "5",
        "SCO_TEMPORAL__UI_URL": "http://temporal-ui.test:8080/",
    }

    def link(workflow_id: str) -> str:
        return f"http://temporal-ui.test:8080/namespaces/{ns_prefix}r1/workflows/{workflow_id}"

    # A second signed bundle (serial 2) for `contracts install` and `publish`.
    key = next((tmp_path / "contracts" / "keys").glob("*.key"))
    bundle = tmp_path / "serial2.json"
    _, serial = compile_and_sign(
        EXAMPLES, REGIONS_DIR, keys.load_signing_key(key), bundle, serial=2,
        created_at=datetime.now(UTC),
    )  # fmt: skip
    assert serial == 2
    tag = uuid.uuid4().hex[:4]
    who = {
        k: f"{k}-{tag}" for k in ("alice", "bob", "carol", "dave", "erin", "frank", "gina", "ivy")
    }

    async def sco(*args: str) -> str:
        code, out = await services.run_sco(env, *args, cwd=REPO)
        assert code == 0, f"sco {' '.join(args)}: {out}"
        return out

    worker_log = (tmp_path / "worker.log").open("wb")
    relay_log = (tmp_path / "relay.log").open("wb")
    worker = spawn(env, worker_log, "worker", "--region", "r1")
    relay = spawn(env, relay_log, "notice-relay", "--region", "r1", "--hall", "D")
    started = time.monotonic()
    try:
        url = f"http://127.0.0.1:{health}/readyz"
        await eventually_async(
            lambda: asyncio.to_thread(ready, url), timeout=90, what="the worker ready", every=0.1
        )
        r1 = ("--region", "r1")
        out = await sco(
            "demand", "set", "ci-runners", "2", *r1, "--by", who["alice"], "--reason", "d"
        )
        partition = partition_of("ci-runners", ControlSettings().partitions)
        assert link(controller_workflow_id("r1", partition)) in out
        assert link("floor-r1-") in await sco("floor", "start", *r1)
        approve = await waiting_for_approval(client, f"au-approve-{tag}", "spark-etl")
        decline = await waiting_for_approval(client, f"au-decline-{tag}", "spark-etl")
        cancel = await waiting_for_approval(client, f"au-cancel-{tag}", "spark-etl")
        bob = ("--by", who["bob"])
        assert link(approve) in await sco(
            "acquisitions", "pause", approve, *r1, *bob, "--reason", "p"
        )
        await sco("acquisitions", "resume", approve, *r1, *bob, "--reason", "r")
        carol = ("--by", who["carol"])
        await sco("acquisitions", "approve", approve, *r1, *carol, "--reason", "a")
        await sco("acquisitions", "approve", decline, *r1, *carol, "--reason", "n", "--decline")
        out = await sco("acquisitions", "cancel", cancel, *r1, "--by", who["dave"], "--reason", "c")
        assert link(cancel) in out
        erin = ("--by", who["erin"])
        assert link("floor-r1-") in await sco("hall", "lost", "r1", "D", *erin, "--reason", "l")
        await sco("hall", "restored", "r1", "D", *erin, "--reason", "b")
        frank = ("--by", who["frank"])
        out = await sco("pool", "exclude", "r1.D.gp.l", *frank, "--reason", "x")
        assert link(exclusion_workflow_id("r1.D.gp.l")) in out
        await sco("pool", "readmit", "r1.D.gp.l", *frank, "--reason", "y")
        out = await sco("reclaim", "--pool", "r1.D.gp.l", *r1, "--by", who["gina"], "--reason", "g")
        assert link(exclusion_workflow_id("r1.D.gp.l")) in out
        # The budget workflow exists once an acquisition has asked it for tokens.
        out = await sco(
            "budget", "set-rate", "20", "40", *r1, "--by", who["alice"], "--reason", "b"
        )
        assert link(budget_workflow_id("r1")) in out
        ivy = ("--by", who["ivy"], "--contract", "spark-etl")
        out = await sco("lifecycle", "pause", *r1, *ivy, "--reason", "freeze")
        assert link(lifecycle_workflow_id("r1")) in out
        await sco("lifecycle", "resume", *r1, *ivy, "--reason", "thaw")
        status = json.loads(await sco("lifecycle", "status", *r1, "--json"))
        assert status["region"] == "r1" and status["ui_url"] == link(lifecycle_workflow_id("r1"))
        hank = ("--by", f"hank-{tag}")
        await sco("contracts", "install", str(bundle), *hank, "--reason", "i")
        await sco("contracts", "publish", str(bundle), "--trust", str(trust), *r1, *hank)
        acted = time.monotonic() - started
    finally:
        stop(relay)
        stop(worker)
        worker_log.close()
        relay_log.close()

    # Not a terminal: JSON, one object per line, the SDK's lines with their workflow's ids.
    for log_file in ("worker.log", "relay.log"):
        lines = [json.loads(x) for x in (tmp_path / log_file).read_text().splitlines() if x]
        assert lines and all({"ts", "level", "logger", "message"} <= x.keys() for x in lines)
        for x in lines:
            if x["logger"] in {"temporalio.workflow", "temporalio.activity"}:
                assert x.get("workflow_id") and x.get("run_id"), x

    want = {
        ("demand", "set", who["alice"]),
        ("budget", "rate_set", who["alice"]),
        ("acquisition", "paused", who["bob"]),
        ("acquisition", "resumed", who["bob"]),
        ("fallback", "approved", who["carol"]),
        ("fallback", "declined", who["carol"]),
        ("acquisition", "cancelled", who["dave"]),
        ("floor", "hall_lost", who["erin"]),
        ("floor", "hall_restored", who["erin"]),
        ("exclusion", "excluded", who["frank"]),
        ("exclusion", "readmitted", who["frank"]),
        ("reclaim", "reclaimed", who["gina"]),
        ("disruption", "paused", who["ivy"]),
        ("disruption", "resumed", who["ivy"]),
        ("contracts", "installed", f"hank-{tag}"),
        ("contracts", "published", f"hank-{tag}"),
    }
    store = LedgerStore(f"chdb://{tmp_path / 'ledger'}")
    try:
        found = ledger_decisions(audit_db, kafka_bootstrap, store, len(want))
    finally:
        store.close()
    mine = [d for d in found if d.actor.endswith(tag)]
    got = {(d.kind.value, d.outcome, d.actor) for d in mine}
    assert want <= got, f"missing: {sorted(want - got)}"
    for d in mine:
        assert d.reason, d  # why
        assert d.occurred_at > datetime.now(UTC) - timedelta(minutes=10), d  # when
        assert d.identity == ""  # no client certificate in this test (see test_tls_clients)
    paused = next(d for d in mine if d.kind.value == "acquisition" and d.outcome == "paused")
    assert paused.subject == "spark-etl" and paused.workflow_id == approve
    print(f"{len(want)} operator actions in {acted:.1f} s, all found in the ledger")
