"""A real Spark job survives the drain of one worker's node: blocks migrate, nothing reruns.

A standalone Master and two Workers (tests/support/spark_cluster.py, the jars of the
`pyspark` wheel on Debian's JRE), one executor each, each Worker on a loopback address of
its own (127.0.0.2, 127.0.0.3): two nodes. (On one shared address, losing the stopped
Worker makes Spark drop every shuffle output on that host, the migrated ones included.)
The driver (this module run as `python -m tests.agent.test_agent_spark`) writes a
shuffle and caches an RDD over both executors, then waits. The node agent gets a signed
notice for worker 1's node on NATS;
the Spark adapter (agent.checkpoint.spark.decommission_worker) sends the Worker SIGPWR,
its executor migrates its shuffle and cached blocks to the other one and exits, and the
Worker is stopped. The driver then reads the shuffle again and the cached RDD: from the
event log, no stage ran twice (no stage attempt > 0, the map stage is skipped, no
FetchFailed), every cached partition is still cached, and the drain report says 0 tasks
lost (from the driver's REST API).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from agent.checkpoint.spark import decommission_worker
from agent.daemon import Agent
from agent.natslink import NatsLink
from agent.scheduler import Workload
from agent.sources.nats import NatsNoticeSource
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.notice import ReclaimNotice
from contracts.notice_signing import sign
from tests.support.agent_fakes import agent_config, notice_key, signed_bundle
from tests.support.paths import REPO
from tests.support.services import free_port
from tests.support.spark_cluster import (
    HOST,
    JAVA_OPTS,
    SparkCluster,
    SparkDaemon,
    get_json,
    wait_for,
)
from tests.support.wait import checked, eventually, eventually_async
from tests.support.worker_nats import NATS_URL

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1500),
    pytest.mark.tools("pyspark", "openjdk-17-jre-headless"),
]

NODE = "spark-n1"
PARTITIONS = 8


def job(master: str, ui_port: int, workdir: Path) -> int:
    """The driver: a shuffle and a cached RDD over both executors, a pause for the drain
    (until `go` exists), then both read again."""
    from pyspark import StorageLevel
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("sco-decommission-test")
        .config("spark.driver.host", HOST)
        .config("spark.driver.bindAddress", HOST)
        .config("spark.ui.port", str(ui_port))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.decommission.enabled", "true")
        .config("spark.storage.decommission.enabled", "true")
        .config("spark.storage.decommission.shuffleBlocks.enabled", "true")
        .config("spark.storage.decommission.rddBlocks.enabled", "true")
        .config("spark.storage.decommission.replicationReattemptInterval", "2s")
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.dir", (workdir / "events").as_uri())
        .config("spark.eventLog.rolling.enabled", "false")  # one plain JSON-lines file
        .config("spark.eventLog.compress", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.extraJavaOptions", JAVA_OPTS)
        .config("spark.executor.extraJavaOptions", JAVA_OPTS)
        .getOrCreate()
    )
    sc = spark.sparkContext
    eventually(
        lambda: sc._jsc.sc().getExecutorMemoryStatus().size() >= 3,
        timeout=840,
        what="the driver and 2 executors registered",
    )
    pairs = sc.parallelize(range(20_000), PARTITIONS).map(lambda x: (x % 97, x))
    sums = pairs.reduceByKey(lambda a, b: a + b, PARTITIONS)
    cached = sc.parallelize(range(20_000), PARTITIONS).map(lambda x: x * 2)
    cached.persist(StorageLevel.MEMORY_ONLY)
    first = {"sums": sorted(sums.collect()), "cached": cached.sum()}
    ready = {"app": sc.applicationId, "ui": f"http://{HOST}:{ui_port}", "rdd": cached.id()}
    (workdir / "ready.json").write_text(json.dumps(ready))
    eventually((workdir / "go").exists, timeout=600, what="the test's go file")
    second = {"sums": sorted(sums.collect()), "cached": cached.sum()}
    (workdir / "done.json").write_text(json.dumps({"same": first == second}))
    spark.stop()
    return 0


class SparkWorkerNode:
    """The node's scheduler as the agent sees it: one Spark worker in a pod of the
    spark-etl contract's namespace, on the node while its JVM runs. (The cluster is real;
    only the Kubernetes in front of it is left out.)"""

    kind = "spark-worker"
    dry_run = False

    def __init__(self, worker: SparkDaemon) -> None:
        self.worker = worker
        self.calls: list[str] = []

    async def cordon(self, node: str, reason: str) -> None:
        self.calls.append("cordon")

    async def workloads(self, node: str) -> list[Workload]:
        if self.worker.proc.poll() is not None:
            return []
        return [
            Workload(
                id="data-pipelines/spark-worker-1",
                socket_name="spark-worker-1",
                namespace="data-pipelines",
                labels={
                    "sco.io/contract": "spark-etl",
                    "app.kubernetes.io/component": "spark-executor",
                },
            )
        ]

    async def requeue(self, workload: Workload, grace_seconds: int) -> None:
        self.calls.append("requeue")

    async def force(self, workload: Workload) -> None:
        self.calls.append("force")
        self.worker.proc.kill()


def events(workdir: Path) -> list[dict[str, Any]]:
    [log] = (workdir / "events").iterdir()
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


@pytest.fixture
def region(nats_region: tuple[Client, str]) -> str:
    return nats_region[1]


async def test_a_drained_spark_worker_migrates_its_blocks_and_the_job_reruns_nothing(
    tmp_path: Path, region: str
) -> None:
    cluster = SparkCluster(tmp_path)
    driver = None
    ui_port = free_port()
    (tmp_path / "events").mkdir()
    try:
        cluster.start_master()
        worker1 = cluster.start_worker("worker1", "127.0.0.2")
        cluster.start_worker("worker2", "127.0.0.3")
        # The driver starts with them (all JVMs at once: startup is most of this test's
        # time) and waits for its two executors itself.
        driver_log = tmp_path / "driver.log"
        with driver_log.open("wb") as out:
            driver = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.agent.test_agent_spark", cluster.url,
                str(ui_port), str(tmp_path),
                cwd=REPO, env={**cluster.env(), "PYSPARK_PYTHON": sys.executable},
                stdout=out, stderr=out,
            )  # fmt: skip
        logs = [*cluster.logs(), driver_log]
        ready = await asyncio.to_thread(
            wait_for, "the first pass of the job",
            lambda: json.loads((tmp_path / "ready.json").read_text()), 900, logs,
        )  # fmt: skip
        app, ui = ready["app"], ready["ui"]
        before = get_json(f"{ui}/api/v1/applications/{app}/executors")
        [on_node] = [e for e in before if e["id"] != "driver" and _on(e, worker1, app)]
        # The executor being drained holds part of the shuffle and of the cache.
        assert on_node["totalShuffleWrite"] > 0 and on_node["rddBlocks"] > 0, on_node

        raw, trust, _ = signed_bundle(tmp_path, notice_regions=[region])
        assert BundleCache(tmp_path / "cache", TrustStore.load(trust)).offer(raw).accepted
        server = decommission_worker(
            worker1.proc.pid, worker1.ui, driver_ui=ui,
            socket_path=tmp_path / "sockets" / "spark-worker-1/sock",
        )  # fmt: skip
        node = SparkWorkerNode(worker1)
        config = agent_config(tmp_path, node=NODE, region=region, nats_urls=[NATS_URL])
        link = NatsLink([NATS_URL])
        source = NatsNoticeSource(link, region, "D", NODE)
        agent = Agent(config, scheduler=node, sources=[source], link=link)
        stop = asyncio.Event()
        run = asyncio.create_task(agent.run(stop))
        nc = await nats.connect(NATS_URL)
        try:
            await asyncio.wait_for(source.watching.wait(), 60)
            now = datetime.now(UTC)
            notice = ReclaimNotice(
                notice_id=ReclaimNotice.stable_id(region, NODE, now),
                region=region, hall="D", node=NODE, pool_id="p",
                issued_at=now, deadline=now + timedelta(seconds=120),
            )  # fmt: skip
            await nc.jetstream().publish(notice.subject, sign(notice, notice_key(tmp_path)))
            await eventually_async(
                checked(lambda: agent.reports), timeout=300, what="the agent's drain report"
            )
        finally:
            await nc.close()
            stop.set()
            await asyncio.wait_for(run, 30)
            server.close()
        [outcome] = agent.reports[0].workloads
        assert (outcome.contract, outcome.action) == ("spark-etl", "decommission")
        assert outcome.result == "decommissioned", outcome
        assert outcome.lost_tasks == 0  # from the driver's REST API
        assert node.calls == ["cordon"]  # it left by itself: no requeue, no force
        assert worker1.proc.returncode is not None

        after = get_json(f"{ui}/api/v1/applications/{app}/allexecutors")
        gone = next(e for e in after if e["id"] == on_node["id"])
        assert not gone["isActive"]
        [rdd] = get_json(f"{ui}/api/v1/applications/{app}/storage/rdd")
        # Every cached partition is still cached: the drained executor's blocks migrated.
        assert rdd["numCachedPartitions"] == rdd["numPartitions"] == PARTITIONS, rdd

        (tmp_path / "go").touch()
        assert await asyncio.wait_for(driver.wait(), 600) == 0, driver_log.read_text()[-3000:]
        assert json.loads((tmp_path / "done.json").read_text()) == {"same": True}
    finally:
        if driver is not None and driver.returncode is None:
            driver.kill()
            await driver.wait()
        await asyncio.to_thread(cluster.close)

    log = events(tmp_path)
    submitted = [e for e in log if e["Event"] == "SparkListenerStageSubmitted"]
    assert all(e["Stage Info"]["Stage Attempt ID"] == 0 for e in submitted)
    reasons = [e["Task End Reason"]["Reason"] for e in log if e["Event"] == "SparkListenerTaskEnd"]
    assert set(reasons) == {"Success"}, reasons  # no FetchFailed, no task lost
    # The second read of the shuffle ran its result stage only: the map stage's output
    # (half of it migrated) was still there, so the map stage was skipped.
    ran: dict[int, list[int]] = {}  # job -> the stages it submitted (ran)
    job_id = -1
    for e in log:
        if e["Event"] == "SparkListenerJobStart":
            job_id = e["Job ID"]
            ran[job_id] = []
        elif e["Event"] == "SparkListenerStageSubmitted":
            ran[job_id].append(e["Stage Info"]["Stage ID"])
    # Jobs: shuffle read, cache filled, (drain), shuffle read again, cache read again.
    assert [len(stages) for _, stages in sorted(ran.items())] == [2, 1, 1, 1], ran


def _on(executor: dict[str, Any], worker: SparkDaemon, app: str) -> bool:
    """Whether the driver's `executor` runs under `worker` (the Worker's own list)."""
    listed = get_json(f"{worker.ui}/json/")["executors"]
    return any(str(e["id"]) == executor["id"] and e["appid"] == app for e in listed)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("master")
    parser.add_argument("ui_port", type=int)
    parser.add_argument("workdir", type=Path)
    args = parser.parse_args()
    sys.exit(job(args.master, args.ui_port, args.workdir))
