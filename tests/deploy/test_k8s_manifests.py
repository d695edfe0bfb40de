"""The Kubernetes manifests (deploy/k8s): every region overlay renders offline with
`kubectl kustomize`, validates against the Kubernetes schemas (kubernetes-validate, when
installed), and keeps the deployment rules of view 25: the control plane only on guaranteed
capacity, spread over halls A-C, two workers through any voluntary disruption, nothing
secret in a ConfigMap, each region in its own namespace."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from contracts.admission.kyverno import CAPACITY_TYPE_LABEL
from tests.support.paths import REPO
from workers.settings import Settings

K8S = REPO / "deploy" / "k8s"
REGIONS = ["r1", "r2", "r3"]
HALL_LABEL = "topology.kubernetes.io/zone"
GUARANTEED = "guaranteed"
KUBECTL = shutil.which("kubectl")

needs_kubectl = pytest.mark.tools("kubectl")

Doc = dict[str, Any]
MONITORING = "monitoring.coreos.com/"


@cache
def render(region: str) -> tuple[Doc, ...]:
    assert KUBECTL is not None
    out = subprocess.run(
        [KUBECTL, "kustomize", str(K8S / "overlays" / region)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d)


def of_kind(docs: tuple[Doc, ...], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: tuple[Doc, ...], kind: str, prefix: str) -> list[Doc]:
    return [d for d in of_kind(docs, kind) if d["metadata"]["name"].startswith(prefix)]


def node_terms(pod: Doc) -> list[list[Doc]]:
    affinity = pod.get("affinity", {}).get("nodeAffinity", {})
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {})
    return [t.get("matchExpressions", []) for t in required.get("nodeSelectorTerms", [])]


def allowed_values(pod: Doc, key: str) -> set[str] | None:
    """The values of node label `key` a pod can be scheduled on, or None if unconstrained.
    Node selector terms are ORed; expressions within a term ANDed."""
    union: set[str] = set()
    for term in node_terms(pod) or [[]]:
        exprs = [e for e in term if e["key"] == key]
        if not exprs and pod.get("nodeSelector", {}).get(key) is None:
            return None
        values: set[str] | None = None
        for e in exprs:
            assert e["operator"] == "In", e
            values = set(e["values"]) if values is None else values & set(e["values"])
        if key in pod.get("nodeSelector", {}):
            sel = {pod["nodeSelector"][key]}
            values = sel if values is None else values & sel
        union |= values or set()
    return union


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"]
    return spec


# -- rendering and schemas --------------------------------------------------------------


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_overlay_renders_with_no_placeholder_left(region: str) -> None:
    docs = render(region)
    text = yaml.safe_dump_all(docs)
    # REGION and BUILD are the base's placeholders; components/region fills them.
    assert not re.search(r"\bREGION\b|\bBUILD\b|_CIDR\b", text)
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "Job",
        "Namespace",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PodMonitor",
        "PrometheusRule",
        "ServiceAccount",
    ]
    # The local-config values are consumed, never applied.
    assert not named(docs, "ConfigMap", "sco-region-values")


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_overlay_validates_against_the_kubernetes_schemas(region: str) -> None:
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate not installed: schema check skipped"
    )
    for doc in render(region):
        if doc["apiVersion"].startswith(MONITORING):
            continue  # the Prometheus Operator's CRDs: checked by test_every_process_is_scraped
        kv.validate(doc, "1.32", strict=True)


def test_example_secrets_validate_and_are_only_placeholders() -> None:
    docs = list(yaml.safe_load_all((K8S / "examples" / "secrets.example.yaml").read_text()))
    assert {d["metadata"]["name"] for d in docs} == {
        "sco-secrets",
        "sco-clouds",
        "sco-contract-trust",
        "sco-notice-key",
        "sco-slurmrestd",
        "sco-workload-kubeconfig",
    }
    for doc in docs:
        assert doc["kind"] == "Secret"
        for value in doc["stringData"].values():
            assert "CHANGE-ME" in value
    try:
        import kubernetes_validate as kv  # type: ignore[import-untyped]
    except ImportError:
        return
    for doc in docs:
        kv.validate(doc, "1.32", strict=True)


# -- the rules --------------------------------------------------------------------------


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_no_pod_can_land_off_guaranteed_capacity(region: str) -> None:
    docs = render(region)
    workloads = of_kind(docs, "Deployment") + of_kind(docs, "Job")
    assert len(workloads) == 9
    for doc in workloads:
        spec = pod_spec(doc)
        assert allowed_values(spec, CAPACITY_TYPE_LABEL) == {GUARANTEED}, doc["metadata"]["name"]
        assert not spec.get("tolerations"), "no toleration of the reclaimable taint"


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_workers_spread_over_three_halls_with_two_always_available(region: str) -> None:
    docs = render(region)
    (worker,) = named(docs, "Deployment", "sco-worker-")
    spec = pod_spec(worker)
    assert worker["spec"]["replicas"] == 3
    assert allowed_values(spec, HALL_LABEL) == {"A", "B", "C"}
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == HALL_LABEL
    assert spread["maxSkew"] == 1 and spread["whenUnsatisfiable"] == "DoNotSchedule"
    pod_labels = worker["spec"]["template"]["metadata"]["labels"]
    assert spread["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    # 3 replicas, 3 halls, max skew 1, DoNotSchedule: exactly one per hall.

    (pdb,) = of_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 2
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

    container, refresh = spec["containers"]
    assert container["command"] + container["args"] == ["sco", "worker", "--region", region]
    assert refresh["args"][:2] == ["contracts", "pull"]
    assert container["resources"]["requests"]["cpu"] == "2"
    assert container["resources"]["limits"]["cpu"] == "2"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    defaults = Settings().worker
    assert ports == {
        "health": defaults.health_port,
        "metrics": defaults.metrics_port,
        "state-metrics": defaults.state_metrics_port,
    }
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    annotations = worker["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(defaults.metrics_port)


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_termination_grace_exceeds_the_graceful_shutdown_setting(region: str) -> None:
    docs = render(region)
    (config,) = named(docs, "ConfigMap", "sco-config-")
    toml = tomllib.loads(config["data"]["sco.toml"])
    shutdown = toml["worker"].get(
        "graceful_shutdown_seconds", Settings().worker.graceful_shutdown_seconds
    )
    (worker,) = named(docs, "Deployment", "sco-worker-")
    assert pod_spec(worker)["terminationGracePeriodSeconds"] > shutdown + 10
    # The settings file is valid for the settings model, with versioning on.
    assert Settings.model_validate(toml).worker.versioning is True


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_notice_relays_pinned_one_per_hall(region: str) -> None:
    docs = render(region)
    relays = named(docs, "Deployment", "sco-notice-relay-")
    halls: list[str] = []
    for relay in relays:
        spec = pod_spec(relay)
        (container,) = spec["containers"]
        args = container["args"]
        assert args[:3] == ["notice-relay", "--region", region]
        hall = args[args.index("--hall") + 1]
        assert allowed_values(spec, HALL_LABEL) == {hall}, relay["metadata"]["name"]
        assert relay["spec"]["replicas"] == 1
        halls.append(hall)
    region_halls = tomllib.loads((REPO / "deploy" / "regions" / f"{region}.toml").read_text())
    assert sorted(halls) == sorted(region_halls["region"]["halls"])


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_single_instance_processes_and_bootstrap_job(region: str) -> None:
    docs = render(region)
    commands = {
        d["metadata"]["name"]: pod_spec(d)["containers"][0]["args"]
        for d in of_kind(docs, "Deployment") + of_kind(docs, "Job")
    }
    assert commands["sco-outbox-relay"] == ["outbox", "relay"]
    assert commands["sco-ledger-consumer"] == ["ledger", "consume"]
    assert commands["sco-temporal-bootstrap"] == ["temporal", "bootstrap", "--region", region]
    assert commands["sco-db-migrate"] == ["db", "migrate"]
    for name in ("sco-outbox-relay", "sco-ledger-consumer"):
        (dep,) = named(docs, "Deployment", name)
        assert dep["spec"]["replicas"] == 1


SECRET_KEY = re.compile(r"password|passwd|secret|dsn|token|credential|private|_key$|^key$", re.I)
SECRET_VALUE = re.compile(
    r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@"  # scheme://user:pass@
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|application_credential_secret|password\s*[:=]",
    re.I,
)


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_no_secret_in_any_configmap(region: str) -> None:
    docs = render(region)
    configmaps = of_kind(docs, "ConfigMap")
    assert configmaps
    for cm in configmaps:
        for key, value in cm.get("data", {}).items():
            assert not SECRET_KEY.search(key), f"{cm['metadata']['name']}: key {key}"
            assert not SECRET_VALUE.search(value), f"{cm['metadata']['name']}: {key}"
            if key.endswith(".toml"):
                # A `*_file` setting names where a Secret is mounted, not the secret.
                flat = "\n".join(
                    line
                    for line in yaml.safe_dump(tomllib.loads(value)).splitlines()
                    if not line.strip().split(":")[0].endswith("_file")
                )
                assert not SECRET_KEY.search(flat), f"{cm['metadata']['name']}: {key}"
    # DSNs arrive from the Secret.
    (worker,) = named(docs, "Deployment", "sco-worker-")
    env = {e["name"]: e for e in pod_spec(worker)["containers"][0]["env"]}
    for name in ("SCO_POSTGRES_DSN", "SCO_LEDGER_DSN"):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "sco-secrets"


def test_secret_patterns_catch_the_shapes_they_are_for() -> None:
    assert SECRET_VALUE.search("postgresql://user:pass@db:5432/sco")
    assert not SECRET_VALUE.search("postgresql://sco@db:5432/sco")
    assert SECRET_KEY.search("SCO_POSTGRES_DSN") and SECRET_KEY.search("api_token")
    assert not SECRET_KEY.search("SCO_REGION")


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_region_stays_in_its_namespace(region: str) -> None:
    docs = render(region)
    ns = f"sco-{region}"
    others = [f"sco-{r}" for r in REGIONS if r != region] + [r for r in REGIONS if r != region]
    (namespace,) = of_kind(docs, "Namespace")
    assert namespace["metadata"]["name"] == ns
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == ns, doc["metadata"]["name"]
    env = named(docs, "ConfigMap", "sco-region")[0]["data"]
    assert env["SCO_REGION"] == region and env["SCO_WORKER__DEPLOYMENT_NAME"] == f"sco-{region}"
    assert env["SCO_REGIONS"] == f'["{region}"]'

    policies = of_kind(docs, "NetworkPolicy")
    (deny,) = [p for p in policies if p["metadata"]["name"] == "default-deny"]
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    for policy in policies:
        spec = policy["spec"]
        peers = [p for rule in spec.get("ingress", []) for p in rule.get("from", [])]
        peers += [p for rule in spec.get("egress", []) for p in rule.get("to", [])]
        for peer in peers:
            selector = peer.get("namespaceSelector")
            if selector is None:
                continue  # same namespace (podSelector) or an ipBlock
            assert selector, "an empty namespaceSelector would allow every namespace"
            labels = selector.get("matchLabels", {})
            assert not selector.get("matchExpressions")
            assert labels.get("kubernetes.io/metadata.name") not in others
            if labels.get("kubernetes.io/metadata.name") != "kube-system":
                assert labels.get("sco.io/region") == region, policy["metadata"]["name"]

    # The rendered region names no other region anywhere.
    text = yaml.safe_dump_all(docs)
    for other in (r for r in REGIONS if r != region):
        assert not re.search(rf"\b(sco-)?{other}\b", text), other


@pytest.mark.parametrize("region", REGIONS)
def test_overlay_region_file_is_the_region_file(region: str) -> None:
    copy = K8S / "overlays" / region / f"{region}.toml"
    assert copy.read_bytes() == (REPO / "deploy" / "regions" / f"{region}.toml").read_bytes(), (
        f"refresh it: cp deploy/regions/{region}.toml {copy.relative_to(REPO)}"
    )


def test_deploy_readme_names_the_rollout_commands() -> None:
    text = Path(REPO / "deploy" / "README.md").read_text()
    for command in (
        "temporal worker deployment set-ramping-version",
        "temporal worker deployment set-current-version",
        "temporal worker deployment describe-version",
        "kubectl kustomize deploy/k8s/overlays/r1",
    ):
        assert command in text


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_every_process_is_scraped_and_probed(region: str) -> None:
    """Each long-running process declares the ports its settings (sco.toml) give its
    metrics and health, is probed on /readyz and /healthz, and the PodMonitor selects it
    and scrapes its metrics ports."""
    docs = render(region)
    (config,) = named(docs, "ConfigMap", "sco-config-")
    s = Settings(**tomllib.loads(config["data"]["sco.toml"]))
    expected = {
        "sco-worker": {
            "health": s.worker.health_port,
            "metrics": s.worker.metrics_port,
            "state-metrics": s.worker.state_metrics_port,
        },
        "sco-notice-relay": {
            "health": s.notice_relay.health_port,
            "metrics": s.notice_relay.metrics_port,
        },
        "sco-outbox-relay": {"health": s.outbox.health_port, "metrics": s.outbox.metrics_port},
        "sco-ledger-consumer": {
            "health": s.ledger_health_port,
            "metrics": s.ledger_metrics_port,
        },
    }
    (monitor,) = of_kind(docs, "PodMonitor")
    (selector,) = monitor["spec"]["selector"]["matchExpressions"]
    assert set(selector["values"]) == set(expected)
    scraped = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    seen = set()
    for doc in of_kind(docs, "Deployment"):
        name = doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
        if name not in expected:
            continue
        seen.add(name)
        container = pod_spec(doc)["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == expected[name], doc["metadata"]["name"]
        assert all(v for v in ports.values()), f"{name}: a port is off in sco.toml"
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
        assert set(ports) - {"health"} <= scraped
    assert seen == set(expected)
    # The drain intake, the ledger consumer's pod's second process.
    (ledger,) = [
        d for d in of_kind(docs, "Deployment") if d["metadata"]["name"].endswith("ledger-consumer")
    ]
    (intake,) = [c for c in pod_spec(ledger)["containers"] if c["name"] == "sco-drain-intake"]
    ports = {p["name"]: p["containerPort"] for p in intake["ports"]}
    assert ports == {
        "intake-health": s.drain_intake_health_port,
        "intake-metrics": s.drain_intake_metrics_port,
    }
    assert intake["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "intake-health"}
    assert "intake-metrics" in scraped
    (rule,) = of_kind(docs, "PrometheusRule")
    assert rule["spec"]["groups"], "the rules of deploy/prometheus/rules/sco.yml"
