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
from contracts.redact import has_credentials
from services.registry import SERVICES
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
    assert not re.search(r"\bREGION\b|\bBUILD\b|_CIDR\b|\bCONTRACTS_(REPO|MIRROR)_URL\b", text)
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
        "sco-credentials",
        *(f"sco-tls-{kind}" for kind in TLS_KINDS),
        "sco-nats-control",
        *(f"sco-nats-relay-{h}" for h in "abcd"),
        "sco-clouds",
        "sco-contract-trust",
        "sco-contract-signing-key",
        "sco-notice-public-keys",
        *(f"sco-notice-key-{h}" for h in "abcd"),
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
    assert len(workloads) == 10
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
    build = yaml.safe_load((K8S / "overlays" / region / "values.yaml").read_text())["data"]
    commands = {
        d["metadata"]["name"].removesuffix(f"-{build['build']}"): pod_spec(d)["containers"][0][
            "args"
        ]
        for d in of_kind(docs, "Deployment") + of_kind(docs, "Job")
    }
    assert commands["sco-outbox-relay"] == ["outbox", "relay"]
    assert commands["sco-ledger-consumer"] == ["ledger", "consume"]
    assert commands["sco-temporal-bootstrap"] == ["temporal", "bootstrap", "--region", region]
    assert commands["sco-db-migrate"] == ["db", "migrate"]
    for name in ("sco-outbox-relay", "sco-ledger-consumer"):
        (dep,) = named(docs, "Deployment", name)
        assert dep["spec"]["replicas"] == 1


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_contract_sync_one_per_region_keys_as_files_and_git_egress(region: str) -> None:
    """One contract sync per region (its bundles and serials are the region's own NATS's),
    stopped before a new one starts; the signing key, the trust directory with
    allowed_signers and the notice keys are files from Secrets, never environment values;
    its egress to the repository's networks on the overlay's port, and to nothing else a
    pod does not already get."""
    docs = render(region)
    (sync,) = named(docs, "Deployment", "sco-contract-sync")
    assert sync["spec"]["replicas"] == 1
    assert sync["spec"]["strategy"] == {"type": "Recreate"}
    spec = pod_spec(sync)
    (container,) = spec["containers"]
    assert container["args"] == ["contracts", "sync", "--region", region]
    env = {e["name"]: e for e in container["env"]}
    assert not [e for e in container["env"] if "valueFrom" in e], "keys come as files"
    values = yaml.safe_load((K8S / "overlays" / region / "values.yaml").read_text())["data"]
    assert env["SCO_CONTRACTS__REPO_URL"]["value"] == values["contracts_repo_url"]
    assert env["SCO_CONTRACTS__MIRROR_URLS"]["value"] == f'["{values["contracts_mirror_url"]}"]'
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    key_file = Path(env["SCO_CONTRACTS__SIGNING_KEY_FILE"]["value"])
    key_volume = volumes["signing-key"]["secret"]
    assert key_volume["secretName"] == "sco-contract-signing-key"
    assert key_volume["defaultMode"] == 0o400
    assert mounts["signing-key"]["mountPath"] == str(key_file.parent)
    assert [i["path"] for i in key_volume["items"]] == [key_file.name]
    assert volumes["trust"]["secret"]["secretName"] == "sco-contract-trust"
    assert mounts["trust"]["mountPath"] == "/etc/sco/trust" and mounts["trust"]["readOnly"]
    notice_dir = env["SCO_CONTRACTS__NOTICE_KEYS_DIR"]["value"]
    assert mounts["notice-keys"]["mountPath"] == f"{notice_dir}/{region}"
    assert volumes["notice-keys"]["secret"]["secretName"] == "sco-notice-public-keys"
    # Only the sync holds the bundle signing key.
    for doc in of_kind(docs, "Deployment") + of_kind(docs, "Job"):
        if doc is not sync:
            names = {v.get("secret", {}).get("secretName") for v in pod_spec(doc)["volumes"]}
            assert "sco-contract-signing-key" not in names, doc["metadata"]["name"]
    (git,) = [
        p for p in of_kind(docs, "NetworkPolicy") if p["metadata"]["name"] == "allow-contract-git"
    ]
    assert git["spec"]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "sco-contract-sync"}
    }
    (rule,) = git["spec"]["egress"]
    cidrs = [peer["ipBlock"]["cidr"] for peer in rule["to"]]
    assert cidrs == [values["contracts_git_cidr"], values["contracts_git_mirror_cidr"]]
    assert rule["ports"] == [{"protocol": "TCP", "port": values["contracts_git_port"]}]
    assert isinstance(rule["ports"][0]["port"], int), "a string would name a port"


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
            # A DSN or URL without credentials is an address, not a secret.
            address = key.endswith(("_DSN", "_URL")) and not has_credentials(value)
            assert address or not SECRET_KEY.search(key), f"{cm['metadata']['name']}: key {key}"
            assert not SECRET_VALUE.search(value), f"{cm['metadata']['name']}: {key}"
            if key.endswith(".toml"):
                # A `*_file` setting names where a Secret is mounted, not the secret.
                flat = "\n".join(
                    line
                    for line in yaml.safe_dump(tomllib.loads(value)).splitlines()
                    if not line.strip().split(":")[0].endswith("_file")
                )
                assert not SECRET_KEY.search(flat), f"{cm['metadata']['name']}: {key}"


def containers(doc: Doc) -> list[Doc]:
    spec = pod_spec(doc)
    return [*spec.get("initContainers", []), *spec["containers"]]


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_no_credential_in_any_manifest_or_environment(region: str) -> None:
    """No password-bearing DSN or URL anywhere in the rendered region (mask_credentials
    changes nothing in it), and no container gets a secret as an environment variable:
    every secret is a file from a Secret volume (decision 0011)."""
    docs = render(region)
    text = yaml.safe_dump_all(docs)
    assert not has_credentials(text), [ln for ln in text.splitlines() if has_credentials(ln)]
    assert not SECRET_VALUE.search(text)
    pods = of_kind(docs, "Deployment") + of_kind(docs, "Job")
    for doc in pods:
        for c in containers(doc):
            where = f"{doc['metadata']['name']}/{c['name']}"
            for e in c.get("env", []):
                assert "secretKeyRef" not in e.get("valueFrom", {}), f"{where}: {e['name']}"
                assert not SECRET_VALUE.search(e.get("value", "")), f"{where}: {e['name']}"
            for ref in c.get("envFrom", []):
                assert "secretRef" not in ref, f"{where}: envFrom a Secret"
    for path in sorted((K8S / "base").glob("*")) + sorted((K8S / "examples").glob("*.yaml")):
        shown = [ln for ln in path.read_text().splitlines() if has_credentials(ln)]
        assert not shown, f"{path.relative_to(REPO)}: {shown}"


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_every_hop_is_tls_with_secrets_mounted_as_files(region: str) -> None:
    """NATS (tls://, client certificate, a per-role user), Temporal, Kafka (SASL_SSL),
    PostgreSQL (verify-full) and ClickHouse use TLS with files from /etc/sco/tls; each pod
    mounts the certificate and password Secrets; each relay is its hall's NATS user."""
    docs = render(region)
    (config,) = named(docs, "ConfigMap", "sco-config-")
    (env_cm,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"] == "sco-region"]
    s = Settings(**tomllib.loads(config["data"]["sco.toml"]))
    assert s.nats_url.startswith("tls://")
    for t in (s.nats_tls, s.temporal.tls, s.kafka.tls, s.ledger.tls):
        assert t.enabled and t.client_cert_file and t.ca_file
        assert str(t.client_cert_file).startswith("/etc/sco/tls/")
    assert s.postgres.sslmode == "verify-full" and s.postgres.password_file
    assert s.kafka.sasl_password_file and s.ledger.password_file and s.nats_auth.password_file
    assert env_cm["data"]["SCO_NATS_AUTH__USER"] == f"control-{region}"
    for name in ("SCO_POSTGRES_DSN", "SCO_LEDGER_DSN"):
        assert region in env_cm["data"][name] and not has_credentials(env_cm["data"][name])
    for doc in of_kind(docs, "Deployment") + of_kind(docs, "Job"):
        volumes = {v["name"]: v for v in pod_spec(doc)["volumes"]}
        # Each process kind presents its own identity: its own certificate Secret.
        assert volumes["tls"]["secret"]["secretName"] == f"sco-tls-{tls_kind(doc)}"
        if "credentials" in volumes:  # the contract sync needs no service password
            assert volumes["credentials"]["secret"]["secretName"] == "sco-credentials"
        for c in containers(doc):
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            assert mounts["tls"] == "/etc/sco/tls"
            assert mounts.get("credentials", "/etc/sco/secrets") == "/etc/sco/secrets"
        if doc["kind"] == "Job":
            continue
        labels = doc["spec"]["template"]["metadata"]["labels"]
        nats = volumes["nats-credentials"]["secret"]["secretName"]
        if labels["app.kubernetes.io/name"] == "sco-notice-relay":
            hall = labels["sco.io/hall"]
            assert nats == f"sco-nats-relay-{hall.lower()}"
            env = {e["name"]: e.get("value") for e in pod_spec(doc)["containers"][0]["env"]}
            assert env["SCO_NATS_AUTH__USER"] == f"relay-{region}-{hall}"
        else:
            assert nats == "sco-nats-control"


#: Every process kind's certificate Secret is `sco-tls-<kind>` (its pods' only one).
TLS_KINDS = (
    "worker",
    *(f"notice-relay-{h}" for h in "abcd"),
    "outbox-relay",
    "ledger-consumer",
    "contract-sync",
    "db-migrate",
    "temporal-bootstrap",
)


def tls_kind(doc: Doc) -> str:
    """The process kind a Deployment's or Job's pods run: its app name without `sco-`, a
    hall's relay with its hall (the kind in `sco-tls-<kind>`)."""
    labels = doc["spec"]["template"]["metadata"]["labels"]
    kind = str(labels["app.kubernetes.io/name"]).removeprefix("sco-")
    return f"{kind}-{labels['sco.io/hall'].lower()}" if "sco.io/hall" in labels else kind


@needs_kubectl
def test_every_pod_mounts_its_own_kinds_certificate() -> None:
    """No two process kinds share a certificate (each has its own SPIFFE ID), and every
    kind's Secret is one the examples document."""
    docs = render("r1")
    seen = {
        tls_kind(d): {v["name"]: v for v in pod_spec(d)["volumes"]}["tls"]["secret"]["secretName"]
        for d in of_kind(docs, "Deployment") + of_kind(docs, "Job")
    }
    assert set(seen) == set(TLS_KINDS)
    assert len(set(seen.values())) == len(seen)


def test_example_certificates_fill_the_mounted_secrets() -> None:
    certs = list(yaml.safe_load_all((K8S / "examples" / "certificates.example.yaml").read_text()))
    assert {c["spec"]["secretName"] for c in certs} == {f"sco-tls-{k}" for k in TLS_KINDS}
    for cert in certs:
        assert cert["kind"] == "Certificate"
        assert "client auth" in cert["spec"]["usages"]
        kind = cert["spec"]["secretName"].removeprefix("sco-tls-")
        if kind.startswith("notice-relay-"):  # a hall's relay: notice-relay/<hall>
            kind = f"notice-relay/{kind[-1].upper()}"
        assert cert["spec"]["uris"] == [f"spiffe://sco/r1/{kind}"]


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
    """Each long-running process of the registry (services/registry.py) that Kubernetes runs
    has its container, started by its `sco` command, declaring the ports its settings
    (sco.toml) give its metrics and health under the registry's port names; it is probed on
    /readyz and /healthz, and the PodMonitor selects its pods and scrapes its metrics ports."""
    docs = render(region)
    (config,) = named(docs, "ConfigMap", "sco-config-")
    s = Settings(**tomllib.loads(config["data"]["sco.toml"]))
    deployed = [svc for svc in SERVICES if svc.kubernetes is not None]
    assert deployed, "the registry lists no process Kubernetes runs"
    (monitor,) = of_kind(docs, "PodMonitor")
    (selector,) = monitor["spec"]["selector"]["matchExpressions"]
    assert set(selector["values"]) == {svc.kubernetes.app for svc in deployed if svc.kubernetes}
    scraped = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    for svc in deployed:
        assert svc.kubernetes is not None
        pods = [
            d
            for d in of_kind(docs, "Deployment")
            if d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
            == svc.kubernetes.app
        ]
        assert pods, f"{svc.name}: no Deployment of {svc.kubernetes.app}"
        for doc in pods:
            shown = f"{doc['metadata']['name']}/{svc.kubernetes.container}"
            (container,) = [
                c for c in pod_spec(doc)["containers"] if c["name"] == svc.kubernetes.container
            ]
            assert container["args"][: len(svc.cli)] == list(svc.cli), shown
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert ports == {p.name: p.value(s) for p in svc.ports}, shown
            assert all(ports.values()), f"{shown}: a port is off in sco.toml"
            (health,) = [p.name for p in svc.ports if not p.scraped]
            assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": health}
            assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": health}
            assert {p.name for p in svc.ports if p.scraped} <= scraped, shown
    (rule,) = of_kind(docs, "PrometheusRule")
    assert rule["spec"]["groups"], "the rules of deploy/prometheus/rules/sco.yml"
