"""The checkpoint client over its Unix socket, and the Kubernetes scheduler over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agent.checkpoint import Request, register, send_request
from agent.daemon import Agent
from agent.drain import DrainEngine
from agent.notices import Notice
from agent.scheduler import Workload
from agent.scheduler.kubernetes import KubernetesScheduler
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.model import CONTRACT_LABEL
from tests.support.agent_fakes import (
    WORKLOAD_SCRIPT,
    RecordingScheduler,
    agent_config,
    signed_bundle,
    training_agent,
    wait_for_path,
)
from tests.support.paths import REPO

pytestmark = pytest.mark.timeout(50)


@pytest.fixture
def workload_process(tmp_path: Path) -> Iterator[Any]:
    """Start a fake training process answering checkpoints after `delay` seconds."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(socket: Path, delay: float) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKLOAD_SCRIPT, str(socket), str(delay)], cwd=REPO
        )
        procs.append(proc)
        wait_for_path(socket)
        return proc

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)


async def test_the_training_workload_checkpoints_within_the_deadline(
    tmp_path: Path, workload_process: Any
) -> None:
    agent, scheduler = training_agent(tmp_path, "31")
    workload_process(tmp_path / "sockets" / "slurm_31/sock", 0.3)
    n = Notice("c1", "g1", datetime.now(UTC) + timedelta(seconds=20), "reclaim", "test")
    started = time.monotonic()
    await agent.submit(n)
    await agent._drain(agent.queue.get_nowait())
    took = time.monotonic() - started
    [outcome] = agent.reports[0].workloads
    assert (outcome.contract, outcome.result) == ("llm-train", "checkpointed")
    assert outcome.path == "file:///ckpt/reclaim"
    assert scheduler.ops() == [("cordon", "g1"), ("requeue", "31")]  # requeued after saving
    assert 0.3 <= took < 5


async def test_a_workload_that_does_not_answer_is_forced_after_the_bound(
    tmp_path: Path, workload_process: Any
) -> None:
    # llm-train's grace is 100 s; the deadline is 3 s away with a 1 s margin: bound 2 s.
    agent, scheduler = training_agent(tmp_path, "32", safety_margin_seconds=1.0)
    workload_process(tmp_path / "sockets" / "slurm_32/sock", 60)
    n = Notice("c2", "g1", datetime.now(UTC) + timedelta(seconds=3), "reclaim", "test")
    started = time.monotonic()
    await agent.submit(n)
    await agent._drain(agent.queue.get_nowait())
    took = time.monotonic() - started
    [outcome] = agent.reports[0].workloads
    assert outcome.result == "forced" and "no answer" in outcome.detail
    assert scheduler.ops() == [("cordon", "g1"), ("force", "32")]
    assert 1.5 < took < 3.0, took


async def test_the_protocol_refuses_another_version_and_answers_ping(tmp_path: Path) -> None:
    import asyncio

    sock = tmp_path / "w.sock"
    server = register(lambda reason, deadline: "p", socket_path=sock)
    try:
        reply = await send_request(sock, Request("ping", "", 0.0), 2)
        assert reply.ok
        reader, writer = await asyncio.open_unix_connection(str(sock))
        writer.write(b'{"v": 2, "op": "checkpoint"}\n')
        await writer.drain()
        answer = json.loads(await reader.readline())
        writer.close()
        assert answer["v"] == 1 and not answer["ok"] and "version" in answer["error"]
        reply = await send_request(sock, Request("decommission", "", 0.0), 2)
        assert not reply.ok and "no handler" in reply.error
    finally:
        server.close()
    assert not sock.exists()


def test_the_bound_is_the_grace_or_the_deadline_less_the_margin() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    engine = DrainEngine(
        RecordingScheduler(), Path("/nonexistent"), dry_run=False,
        safety_margin_seconds=5, clock=lambda: now,
    )  # fmt: skip
    assert engine.bound(30, now + timedelta(seconds=100)) == 30
    assert engine.bound(30, now + timedelta(seconds=20)) == 15
    assert engine.bound(30, now + timedelta(seconds=2)) == 0


class _FakeApiServer(BaseHTTPRequestHandler):
    requests: ClassVar[list[tuple[str, str, Any]]] = []
    pods: ClassVar[dict[str, Any]] = {}
    # Evictions of a "budget" pod a PodDisruptionBudget refuses (429) before allowing one.
    budget_refusals: ClassVar[int] = 0

    def _reply(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.requests.append(
            (self.command, self.path, {"body": body, "ctype": self.headers.get("Content-Type"),
                                       "auth": self.headers.get("Authorization")})
        )  # fmt: skip

    def do_GET(self) -> None:
        self._record()
        self._reply(200, self.pods)

    def do_PATCH(self) -> None:
        self._record()
        self._reply(200, {})

    def do_POST(self) -> None:
        self._record()
        if "gone" in self.path:
            self._reply(404, {"reason": "NotFound"})
        elif "blocked" in self.path:
            self._reply(429, {"reason": "TooManyRequests"})
        elif "budget" in self.path and type(self).budget_refusals > 0:
            type(self).budget_refusals -= 1
            self._reply(429, {"reason": "TooManyRequests", "message": "disruption budget"})
        else:
            self._reply(201, {})

    def do_DELETE(self) -> None:
        self._record()
        self._reply(200, {})

    def log_message(self, *args: Any) -> None:
        pass


def _pod(ns: str, name: str, labels: dict[str, str], owner: str = "ReplicaSet") -> Any:
    return {
        "metadata": {"namespace": ns, "name": name, "labels": labels,
                     "ownerReferences": [{"kind": owner, "name": "o"}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


async def test_kubernetes_cordon_list_evict_and_force_follow_the_api(tmp_path: Path) -> None:
    _FakeApiServer.requests = []
    _FakeApiServer.pods = {
        "items": [
            _pod("ci", "build-1", {CONTRACT_LABEL: "ci-runners"}),
            _pod("training", "trainer-0", {CONTRACT_LABEL: "llm-train", "team": "ml-research"}),
            _pod("training", "blocked-0", {CONTRACT_LABEL: "llm-train", "team": "ml-research"}),
            _pod("kube-system", "node-exporter", {}, owner="DaemonSet"),
        ]
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    try:
        k8s = KubernetesScheduler(
            f"http://127.0.0.1:{server.server_port}", dry_run=False, token_path=token
        )
        agent, _ = training_agent(tmp_path, "unused", scheduler="kubernetes")
        agent.engine = DrainEngine(
            k8s, tmp_path / "sockets", dry_run=False, safety_margin_seconds=1
        )
        n = Notice("k1", "g1", datetime.now(UTC) + timedelta(seconds=30), "reclaim", "test")
        await agent.submit(n)
        await agent._drain(agent.queue.get_nowait())
    finally:
        server.shutdown()
    report = agent.reports[0]
    results = {w.workload: (w.contract, w.result) for w in report.workloads}
    assert results == {
        "ci/build-1": ("ci-runners", "requeued"),  # evicted
        "training/trainer-0": ("llm-train", "forced"),  # no checkpoint socket
        "training/blocked-0": ("llm-train", "forced"),
    }
    calls = [(m, p) for m, p, _ in _FakeApiServer.requests]
    assert calls[0] == ("PATCH", "/api/v1/nodes/g1")
    assert calls[1] == ("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dg1")
    assert ("POST", "/api/v1/namespaces/ci/pods/build-1/eviction") in calls
    assert ("DELETE", "/api/v1/namespaces/training/pods/trainer-0") in calls
    patch = _FakeApiServer.requests[0][2]
    assert patch["body"] == {"spec": {"unschedulable": True}}
    assert patch["ctype"] == "application/strategic-merge-patch+json"
    assert patch["auth"] == "Bearer secret-token"
    eviction = next(r[2]["body"] for r in _FakeApiServer.requests if r[1].endswith("eviction"))
    assert eviction["apiVersion"] == "policy/v1" and eviction["kind"] == "Eviction"
    assert not any("node-exporter" in p for _, p in calls)  # DaemonSet pods stay


async def test_a_spark_executor_decommissions_and_leaves_without_being_forced(
    tmp_path: Path,
) -> None:
    raw, trust, _ = signed_bundle(tmp_path)
    assert BundleCache(tmp_path / "cache", TrustStore.load(trust)).offer(raw).accepted
    spark_contract = "spark-etl"
    from tests.support.paths import EXAMPLES

    assert (EXAMPLES / f"{spark_contract}.yaml").exists()
    # spark-etl takes Kubernetes executors only: the pod names it and carries its labels.
    job = Workload(
        id="data-pipelines/exec-1",
        socket_name="exec-1",
        namespace="data-pipelines",
        labels={CONTRACT_LABEL: spark_contract, "app.kubernetes.io/component": "spark-executor"},
    )
    scheduler = RecordingScheduler([job])

    def decommission(reason: str, deadline: float) -> str:
        scheduler.workloads_on_node = []  # the executor migrated its blocks and exited
        return ""

    server = register(decommission=decommission, socket_path=tmp_path / "sockets/exec-1/sock")
    agent = Agent(agent_config(tmp_path, node="s1"), scheduler=scheduler, sources=[])
    try:
        await agent.submit(Notice("d1", "s1", datetime.now(UTC) + timedelta(seconds=30), "", "t"))
        await agent._drain(agent.queue.get_nowait())
    finally:
        server.close()
    [outcome] = agent.reports[0].workloads
    assert (outcome.contract, outcome.action, outcome.result) == (
        "spark-etl",
        "decommission",
        "decommissioned",
    )
    assert scheduler.ops() == [("cordon", "s1")]  # nothing forced


async def test_a_disruption_budget_is_retried_within_the_deadline_then_forced(
    tmp_path: Path,
) -> None:
    """A PDB's 429 is asked again until the deadline-bounded grace, never forced at once;
    one that keeps refusing is forced before the notice deadline, not after it."""
    _FakeApiServer.requests = []
    _FakeApiServer.budget_refusals = 2
    _FakeApiServer.pods = {
        "items": [
            _pod("ci", "budget-1", {CONTRACT_LABEL: "ci-runners"}),
            _pod("ci", "blocked-build", {CONTRACT_LABEL: "ci-runners"}),
        ]
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        k8s = KubernetesScheduler(f"http://127.0.0.1:{server.server_port}", dry_run=False)
        agent, _ = training_agent(tmp_path, "unused", scheduler="kubernetes")
        agent.engine = DrainEngine(
            k8s, tmp_path / "sockets", dry_run=False, safety_margin_seconds=1
        )
        deadline = datetime.now(UTC) + timedelta(seconds=6)
        await agent.submit(Notice("k2", "g1", deadline, "reclaim", "test"))
        await agent._drain(agent.queue.get_nowait())
        finished = datetime.now(UTC)
    finally:
        server.shutdown()
    outcomes = {w.workload: w for w in agent.reports[0].workloads}
    assert outcomes["ci/budget-1"].result == "requeued"
    assert "disruption budget" in outcomes["ci/budget-1"].detail
    assert outcomes["ci/blocked-build"].result == "forced"
    assert "after retrying until the bound" in outcomes["ci/blocked-build"].detail
    assert finished < deadline  # never waits past the notice deadline
    calls = [(m, p) for m, p, _ in _FakeApiServer.requests]
    assert calls.count(("POST", "/api/v1/namespaces/ci/pods/budget-1/eviction")) == 3
    assert calls.count(("POST", "/api/v1/namespaces/ci/pods/blocked-build/eviction")) >= 3
    # The pod's grace is what the deadline leaves, not the contract's full grace.
    graces = [
        r[2]["body"]["deleteOptions"]["gracePeriodSeconds"]
        for r in _FakeApiServer.requests
        if r[1].endswith("eviction")
    ]
    assert max(graces) <= 5
