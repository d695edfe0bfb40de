"""The Kubernetes demand source, through the official client's real HTTP requests.

No API server runs here: the client talks to tests/k8s_recorded_server.py, which answers
from the recordings in tests/data/k8s_recordings/ (see tests/K8S_TESTING.md for what that does
and does not cover).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel
from kubernetes.client import V1PodSpec

from activities.demand.kubernetes import (
    KubernetesPendingPods,
    Request,
    api_client_from_kubeconfig,
    cpu_cores,
    device_count,
    memory_gib,
    pod_request,
)
from activities.demand.model import Scheduler, Unmatched, normalise
from activities.demand.source import DemandSource, SourceUnavailable
from contracts.admission.kyverno import (
    BOUND_FOR_RECLAIMABLE,
    CAPACITY_TYPE_LABEL,
    RECLAIMABLE,
    RECLAIMABLE_TAINT_KEY,
)
from contracts.model import Contract
from contracts.node_labels import kubelet_join_args, node_labels, node_taints
from tests.support.contract_fixtures import example
from tests.support.k8s_recorded_server import (
    TOKEN,
    RecordedServer,
    load_recording,
    recorded_k8s_server,
    write_kubeconfig,
)

pytestmark = pytest.mark.timeout(30)

PENDING_QUERY = {"fieldSelector": "status.phase=Pending", "limit": "500"}


def contracts() -> list[Contract]:
    spark = example("spark-etl")
    # A small unit, so an executor of 2 vCPU / 8 GiB is two units.
    spark["unit"] = {"vcpu": 1, "memory_gib": 4}
    data = [spark, example("ci-runners"), example("llm-train"), example("search-api")]
    return [Contract.model_validate(d, strict=False) for d in data]


@contextmanager
def source(
    tmp_path: Path, *recordings: str, **kwargs: Any
) -> Iterator[tuple[RecordedServer, KubernetesPendingPods]]:
    """The source, with a client built from a kubeconfig naming the recorded server."""
    with recorded_k8s_server(*recordings) as server:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url)
        with api_client_from_kubeconfig(str(kubeconfig), "recorded") as api:
            yield server, KubernetesPendingPods(api, **kwargs)
        assert server.unmatched == [], "the client sent a request no recording answers"


# --- what is read, and how ---------------------------------------------------------------


async def test_lists_pending_pods_cluster_wide_with_one_request(tmp_path: Path) -> None:
    with source(tmp_path, "pending_pods") as (server, src):
        assert isinstance(src, DemandSource)
        works = await src.pending()
    [req] = server.requests
    assert (req.method, req.path, req.query) == ("GET", "/api/v1/pods", PENDING_QUERY)
    assert req.headers["authorization"] == f"Bearer {TOKEN}"
    assert req.headers["accept"] == "application/json"

    by_ref = {w.ref: w for w in works}
    # Not counted: bound to a node (ContainerCreating), being deleted, held by a
    # scheduling gate.
    assert sorted(by_ref) == [
        "ci/integration-db-91b2e-hx8rt",
        "ci/runner-x7kq2-project-318-concurrent-0-bq9zd",
        "data-pipelines/nightly-etl-5c2e7a9f1b3d-exec-1",
        "data-pipelines/nightly-etl-5c2e7a9f1b3d-exec-2",
        "default/adhoc-notebook-0",
        "training/llm-train-7b-worker-0",
    ]
    executor = by_ref["data-pipelines/nightly-etl-5c2e7a9f1b3d-exec-1"]
    assert executor.scheduler is Scheduler.KUBERNETES
    assert (executor.namespace, executor.contract) == ("data-pipelines", "spark-etl")
    assert executor.labels["app.kubernetes.io/component"] == "spark-executor"
    assert (executor.vcpu, executor.memory_gib, executor.gpus) == (2.0, 8.0, 0)
    # Two containers: 500m + 100m cpu, 1Gi + 128Mi; the build container's larger limits
    # do not count where it has requests.
    runner = by_ref["ci/runner-x7kq2-project-318-concurrent-0-bq9zd"]
    assert (runner.contract, runner.vcpu, runner.memory_gib) == ("ci-runners", 0.6, 1.125)
    # The init container (4 cpu, 2Gi) is larger than the containers' cpu (1.25) but not
    # their memory (2.25 GiB): each dimension takes its own maximum.
    init = by_ref["ci/integration-db-91b2e-hx8rt"]
    assert (init.contract, init.vcpu, init.memory_gib) == (None, 4.0, 2.25)
    # GPUs given as a limit only: the request defaults to the limit.
    train = by_ref["training/llm-train-7b-worker-0"]
    assert (train.vcpu, train.memory_gib, train.gpus) == (8.0, 96.0, 2)


async def test_units_per_contract(tmp_path: Path) -> None:
    with source(tmp_path, "pending_pods") as (_, src):
        works = await src.pending()
    demand = normalise(contracts(), "r1", works)
    assert demand.units == {
        "spark-etl": 4,  # two executors of 2 vCPU / 8 GiB, unit 1 vCPU / 4 GiB
        "ci-runners": 1,  # the runner
        "llm-train": 2,  # 2 GPUs, unit of 1 GPU
    }
    assert demand.items == {"spark-etl": 2, "ci-runners": 1, "llm-train": 1}
    # The init-heavy pod tolerates the reclaimable taint but names no contract: admission
    # would refuse it on reclaimable capacity, so it is no demand for it (contracts.matching).
    no_label = "pod names no contract (label sco.io/contract=<name>)"
    assert demand.unmatched == [
        Unmatched(ref="ci/integration-db-91b2e-hx8rt", reason=no_label),
        Unmatched(ref="default/adhoc-notebook-0", reason=no_label),
    ]


async def test_namespaces_are_listed_one_by_one(tmp_path: Path) -> None:
    recordings = ("pending_pods_ns_data_pipelines", "pending_pods_ns_ci")
    with source(tmp_path, *recordings, namespaces=["data-pipelines", "ci"]) as (server, src):
        works = await src.pending()
    assert [(r.path, r.query) for r in server.requests] == [
        ("/api/v1/namespaces/data-pipelines/pods", PENDING_QUERY),
        ("/api/v1/namespaces/ci/pods", PENDING_QUERY),
    ]
    assert sorted(w.ref for w in works) == [
        "ci/integration-db-91b2e-hx8rt",
        "ci/runner-x7kq2-project-318-concurrent-0-bq9zd",
        "data-pipelines/nightly-etl-5c2e7a9f1b3d-exec-1",
        "data-pipelines/nightly-etl-5c2e7a9f1b3d-exec-2",
    ]
    assert normalise(contracts(), "r1", works).units == {"spark-etl": 4, "ci-runners": 1}


async def test_an_empty_namespace_list_means_cluster_wide(tmp_path: Path) -> None:
    # Listing no namespace at all would report zero demand and let capacity go.
    with source(tmp_path, "pending_pods", namespaces=[]) as (server, src):
        assert len(await src.pending()) == 6
    assert [r.path for r in server.requests] == ["/api/v1/pods"]


async def test_pages_are_followed_with_the_continue_token(tmp_path: Path) -> None:
    recordings = ("pending_pods_page_1", "pending_pods_page_2")
    with source(tmp_path, *recordings, page_size=5) as (server, paged):
        works = await paged.pending()
    first, second = server.requests
    assert first.query == {"fieldSelector": "status.phase=Pending", "limit": "5"}
    token = load_recording("pending_pods_page_1")["response"]["body"]["metadata"]["continue"]
    assert second.query == {**first.query, "continue": token}

    with source(tmp_path, "pending_pods") as (_, whole):
        assert await whole.pending() == works


async def test_a_pod_with_a_bad_quantity_is_skipped_not_the_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), source(tmp_path, "bad_quantity") as (_, src):
        works = await src.pending()
    assert [w.ref for w in works] == ["ci/runner-x7kq2-project-318-concurrent-0-bq9zd"]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "ci/runner-x7kq2-project-512-concurrent-0-zz9xq" in warning
    assert "spec.containers[build].resources.requests[cpu]" in warning
    assert "'2 cores'" in warning


# --- when the cluster cannot be read ----------------------------------------------------


@pytest.mark.parametrize(
    ("recording", "expected"),
    [
        ("error_500", "HTTP 500 Internal Server Error: Internal error occurred: etcdserver"),
        ("forbidden_403", 'HTTP 403 Forbidden: pods is forbidden: User "system:serviceaccount'),
        ("malformed_items", "malformed answer"),
        ("malformed_not_json", "malformed answer"),
    ],
)
async def test_errors_make_the_source_unavailable(
    tmp_path: Path, recording: str, expected: str
) -> None:
    with source(tmp_path, recording) as (server, src), pytest.raises(SourceUnavailable) as caught:
        await src.pending()
    assert caught.value.source == "kubernetes"
    assert caught.value.reason.startswith(expected)
    assert len(server.requests) == 1  # statuses are not retried by the client


async def test_a_stopped_server_is_unavailable(tmp_path: Path) -> None:
    with recorded_k8s_server("pending_pods") as server:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url)
        with api_client_from_kubeconfig(str(kubeconfig), None) as api:
            src = KubernetesPendingPods(api)
            await src.pending()  # leaves a kept-alive connection in the client's pool
            server.stop()
            with pytest.raises(SourceUnavailable, match="Connection refused"):
                await src.pending()


async def test_a_silent_server_times_out(tmp_path: Path) -> None:
    slow = source(tmp_path, "slow_pods", request_timeout=0.2)
    with slow as (server, src), pytest.raises(SourceUnavailable, match="timed out"):
        await src.pending()
    # urllib3's default Retry(total=3) retries a GET's read timeout: the worst case is
    # four times request_timeout per page.
    assert len(server.requests) == 4


async def test_a_request_no_recording_answers_is_caught(tmp_path: Path) -> None:
    with recorded_k8s_server("pending_pods") as server:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url)
        with api_client_from_kubeconfig(str(kubeconfig), None) as api:
            src = KubernetesPendingPods(api, namespaces=["nowhere"])
            with pytest.raises(SourceUnavailable, match="HTTP 404 Not Found: the server could"):
                await src.pending()
    assert [r.path for r in server.unmatched] == ["/api/v1/namespaces/nowhere/pods"]


def test_kubeconfig_problems_name_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(SourceUnavailable, match=f"kubeconfig {missing}: no such file"):
        api_client_from_kubeconfig(str(missing), None)
    broken = tmp_path / "broken"
    broken.write_text("clusters: [unclosed\n")
    with pytest.raises(SourceUnavailable, match=f"kubeconfig {broken}: "):
        api_client_from_kubeconfig(str(broken), None)
    good = write_kubeconfig(tmp_path / "good", "http://127.0.0.1:1")
    with pytest.raises(SourceUnavailable, match=f"kubeconfig {good}: .*elsewhere"):
        api_client_from_kubeconfig(str(good), "elsewhere")
    # Inside a pod without a path: the service account, which this machine does not have.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(SourceUnavailable, match="in-cluster config"):
        api_client_from_kubeconfig(None, None)


# --- quantities and pod sizes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("q", "cores"),
    [("500m", 0.5), ("2", 2.0), ("0.5", 0.5), ("100m", 0.1), ("1k", 1000.0), ("2e0", 2.0)],
)
def test_cpu_cores(q: str, cores: float) -> None:
    assert cpu_cores(q) == pytest.approx(cores)


@pytest.mark.parametrize(
    ("q", "gib"),
    [
        ("512Mi", 0.5),
        ("1Gi", 1.0),
        ("1.5Gi", 1.5),
        ("1G", 1e9 / 2**30),
        ("1000M", 1e9 / 2**30),
        ("123456", 123456 / 2**30),
        ("1e9", 1e9 / 2**30),
        ("1E", 1e18 / 2**30),  # E alone is exa, not an exponent
        ("64Ki", 64 / 2**20),
    ],
)
def test_memory_gib(q: str, gib: float) -> None:
    assert memory_gib(q) == pytest.approx(gib)


@pytest.mark.parametrize("bad", ["", "2 cores", "1 Gi", " 1", "Gi", "1e", "1Mii", "-1", "1e99"])
def test_bad_quantities_raise_naming_the_quantity(bad: str) -> None:
    with pytest.raises(ValueError, match=f"bad quantity {bad!r}"):
        cpu_cores(bad)
    with pytest.raises(ValueError, match=f"bad quantity {bad!r}"):
        memory_gib(bad)


def test_devices_come_whole() -> None:
    assert device_count("2") == 2
    with pytest.raises(ValueError, match="whole numbers"):
        device_count("500m")


def spec(doc: dict[str, Any]) -> V1PodSpec:
    parsed = V1PodSpec.from_dict(doc)
    assert parsed is not None
    return parsed


def res(cpu: str, memory: str) -> dict[str, Any]:
    return {"requests": {"cpu": cpu, "memory": memory}}


def test_sidecars_run_beside_what_follows_them_and_overhead_is_added() -> None:
    pod = spec(
        {
            "initContainers": [
                # A native sidecar: it keeps running through the rest of the pod's life.
                {"name": "proxy", "restartPolicy": "Always", "resources": res("500m", "1Gi")},
                {"name": "migrate", "resources": res("3", "1Gi")},
            ],
            "containers": [{"name": "app", "resources": res("1", "4Gi")}],
            "overhead": {"cpu": "250m", "memory": "160Mi"},
        }
    )
    # cpu: max(1 + 0.5 sidecar, 3 + 0.5 while migrating) + 0.25 overhead
    # memory: max(4 + 1, 1 + 1) GiB + 160 MiB overhead
    assert pod_request(pod) == Request(vcpu=3.75, memory_gib=5 + 160 / 1024, gpus=0)


def test_a_container_without_resources_asks_for_nothing() -> None:
    assert pod_request(spec({"containers": [{"name": "app"}]})) == Request()


# --- node labels and taints --------------------------------------------------------------


def test_node_labels_and_kubelet_flags() -> None:
    assert node_labels("r1.A.gp.l", "A", "reclaimable") == {
        "sco.io/pool": "r1.A.gp.l",
        "sco.io/hall": "A",
        CAPACITY_TYPE_LABEL: RECLAIMABLE,
        "topology.kubernetes.io/zone": "A",
    }
    assert node_taints("reclaimable") == [f"{RECLAIMABLE_TAINT_KEY}=true:NoSchedule"]
    assert node_taints("committed") == []
    assert kubelet_join_args("r1.B.cpu.xl", "B", "reclaimable") == [
        "--node-labels=sco.io/pool=r1.B.cpu.xl,sco.io/hall=B,"
        "sco.io/capacity-type=reclaimable,topology.kubernetes.io/zone=B",
        "--register-with-taints=sco.io/reclaimable=true:NoSchedule",
    ]
    assert kubelet_join_args("r1.B.cpu.xl", "B", "committed") == [
        "--node-labels=sco.io/pool=r1.B.cpu.xl,sco.io/hall=B,"
        "sco.io/capacity-type=committed,topology.kubernetes.io/zone=B",
    ]
    with pytest.raises(ValueError, match="capacity type 'guaranteed'"):
        node_taints("guaranteed")
    with pytest.raises(ValueError, match="not a valid Kubernetes label value"):
        node_labels("r1/A", "A", "committed")


def _bound_for_reclaimable(pod_spec: dict[str, Any]) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(BOUND_FOR_RECLAIMABLE))
    return bool(program.evaluate({"object": json_to_cel({"spec": pod_spec})}))


def test_a_pod_fit_for_a_reclaimable_node_is_one_the_kyverno_policy_checks() -> None:
    """What lets a pod onto a reclaimable node (tolerating its taint, or selecting its
    capacity-type label) is exactly what the policy treats as bound for reclaimable."""
    [taint] = node_taints("reclaimable")
    key_value, effect = taint.split(":")
    key, value = key_value.split("=")
    toleration = {"key": key, "operator": "Equal", "value": value, "effect": effect}
    assert _bound_for_reclaimable({"tolerations": [toleration]})
    label = {CAPACITY_TYPE_LABEL: node_labels("r1.A.gp.l", "A", "reclaimable")[CAPACITY_TYPE_LABEL]}
    assert _bound_for_reclaimable({"nodeSelector": label})
    committed = {
        CAPACITY_TYPE_LABEL: node_labels("r1.A.gp.l", "A", "committed")[CAPACITY_TYPE_LABEL]
    }
    assert not _bound_for_reclaimable({"nodeSelector": committed})
