"""What Kubernetes cannot check by itself, checked on the rendered overlays: every endpoint
a pod's settings name is allowed by the NetworkPolicies (resolved through the estate
example), every setting that needs a file has it mounted, every Secret and key a pod uses
is among the documented inputs (deploy/k8s/examples/), the bundle reaches the
controllers, and the schema migration runs as a Job. Probe cases break the shipped
overlay one way each (the defects of issue 19) and show the check fails."""

from __future__ import annotations

import copy
import ipaddress
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy.test_k8s_manifests import K8S, REGIONS, needs_kubectl, render
from workers.settings import Settings

Doc = dict[str, Any]
EXAMPLES = K8S / "examples"

#: What each process connects to and reads, from its code (workers/*.py).
NEEDS: dict[tuple[str, str], set[str]] = {
    ("worker", "--region"): {
        "temporal",
        "postgres",
        "ledger",
        "nats",
        "openstack",
        "slurm",
        "kubernetes",
        "contracts",
    },
    ("notice-relay", "--region"): {"temporal", "postgres", "nats", "openstack", "notice-key"},
    ("outbox", "relay"): {"postgres", "kafka"},
    ("ledger", "consume"): {"kafka", "ledger"},
    ("ledger", "book-drains"): {"nats", "ledger"},
    ("temporal", "bootstrap"): {"temporal"},
    ("db", "migrate"): {"postgres"},
    ("contracts", "pull"): {"nats", "contracts"},
    ("contracts", "sync"): {"nats", "contracts", "git", "contract-signing-key", "notice-keys"},
}
#: A git URL's port when it names none.
GIT_PORTS = {"https": 443, "http": 80, "ssh": 22, "git": 9418}


def _docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _matches(selector: Doc, labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In", e
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


class Inputs:
    def __init__(self, secrets: list[Doc], estate: list[Doc]) -> None:
        self.secrets = {d["metadata"]["name"]: d["stringData"] for d in secrets}
        self.namespaces = {
            d["metadata"]["name"]: d["metadata"].get("labels", {})
            for d in estate
            if d["kind"] == "Namespace"
        }
        self.services = {
            (d["metadata"]["name"], d["metadata"]["namespace"]): d["spec"]
            for d in estate
            if d["kind"] == "Service"
        }
        (addr,) = [d for d in estate if d["kind"] == "ConfigMap"]
        self.addresses: dict[str, str] = addr["data"]


def shipped_inputs() -> Inputs:
    return Inputs(_docs(EXAMPLES / "secrets.example.yaml"), _docs(EXAMPLES / "estate.example.yaml"))


def _allowed(
    policies: list[Doc], pod: dict[str, str], host: str, port: int, inputs: Inputs
) -> bool:
    parts = host.split(".")
    for policy in policies:
        spec = policy["spec"]
        if "Egress" not in spec.get("policyTypes", []) or not _matches(spec["podSelector"], pod):
            continue
        for rule in spec.get("egress", []):
            if port not in {p["port"] for p in rule.get("ports", [])}:
                continue
            for peer in rule.get("to", []):
                if len(parts) >= 3 and parts[2] == "svc":
                    svc = inputs.services.get((parts[0], parts[1]))
                    ns = inputs.namespaces.get(parts[1])
                    sel = peer.get("namespaceSelector")
                    if svc is None or ns is None or sel is None:
                        continue
                    if _matches(sel, ns) and _matches(peer.get("podSelector", {}), svc["selector"]):
                        return True
                elif "ipBlock" in peer and host in inputs.addresses:
                    net = ipaddress.ip_network(peer["ipBlock"]["cidr"])
                    if ipaddress.ip_address(inputs.addresses[host]) in net:
                        return True
    return False


def _hostport(url: str, default: int) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"x://{url}")
    assert parts.hostname, url
    return parts.hostname, parts.port or default


def problems(
    docs: list[Doc], inputs: Inputs, tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    out: list[str] = []
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    cms = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    toml_text = next(v["sco.toml"] for k, v in cms.items() if k.startswith("sco-config"))
    (tmp / "sco.toml").write_text(toml_text)
    workloads = [d for d in docs if d["kind"] in ("Deployment", "Job")]
    if not any(
        c["args"][:2] == ["db", "migrate"]
        for w in workloads
        for c in w["spec"]["template"]["spec"]["containers"]
    ):
        out.append("no Job runs `sco db migrate`")
    for w in workloads:
        spec = w["spec"]["template"]["spec"]
        pod = w["spec"]["template"]["metadata"]["labels"]
        name = w["metadata"]["name"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        containers = spec.get("initContainers", []) + spec["containers"]
        for v in volumes.values():
            if "secret" in v:
                sec = inputs.secrets.get(v["secret"]["secretName"])
                if sec is None:
                    out.append(
                        f"{name}: Secret {v['secret']['secretName']} not in the documented inputs"
                    )
                    continue
                for item in v["secret"].get("items", []):
                    if item["key"] not in sec:
                        out.append(
                            f"{name}: Secret {v['secret']['secretName']} has no key {item['key']}"
                        )
        for c in containers:
            need = NEEDS[(c["args"][0], c["args"][1])]
            env: dict[str, str] = {}
            for e in c.get("envFrom", []):
                env.update(cms[e["configMapRef"]["name"]])
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref is None:
                    env[e["name"]] = e["value"]
                elif ref["key"] not in inputs.secrets.get(ref["name"], {}):
                    out.append(
                        f"{name}/{c['name']}: Secret {ref['name']} key {ref['key']} "
                        "not in the documented inputs"
                    )
                else:
                    env[e["name"]] = inputs.secrets[ref["name"]][ref["key"]]
            env["SCO_CONFIG"] = str(tmp / "sco.toml")
            with monkeypatch.context() as m:
                for k in [k for k in os.environ if k.startswith(("SCO_", "OS_"))]:
                    m.delenv(k)
                for k, v in env.items():
                    m.setenv(k, v)
                s = Settings()
            where = f"{name}/{c['name']}"

            def mounted(
                path: Path | str | None,
                what: str,
                c: Doc = c,
                where: str = where,
                volumes: dict[str, Doc] = volumes,
            ) -> None:
                if path is None:
                    out.append(f"{where}: {what} is not set")
                    return
                p = Path(path)
                for vm in c.get("volumeMounts", []):
                    mp = Path(vm["mountPath"])
                    if p == mp or mp in p.parents:
                        vol = volumes[vm["volumeName"] if "volumeName" in vm else vm["name"]]
                        items = vol.get("secret", {}).get("items")
                        if (
                            items
                            and p != mp
                            and str(p.relative_to(mp)) not in {i["path"] for i in items}
                        ):
                            continue
                        return
                out.append(f"{where}: {what} {p} is not mounted")

            def reach(
                url: str, default: int, what: str, where: str = where, pod: dict[str, str] = pod
            ) -> None:
                host, port = _hostport(url, default)
                if not _allowed(policies, pod, host, port, inputs):
                    out.append(
                        f"{where}: {what} {host}:{port} is not allowed by the NetworkPolicies"
                    )

            def tls_files(t: Any, what: str) -> None:
                for key in ("ca_file", "client_cert_file", "client_key_file"):
                    if getattr(t, key) is not None:
                        mounted(getattr(t, key), f"{what}.{key}")

            if "temporal" in need:
                reach(s.temporal.address, 7233, "temporal")
                tls_files(s.temporal.tls, "temporal.tls")
            if "nats" in need:
                reach(s.nats_url, 4222, "nats")
                tls_files(s.nats_tls, "nats_tls")
                if s.nats_auth.user:
                    mounted(s.nats_auth.password_file, "nats_auth.password_file")
            if "kafka" in need:
                reach(s.kafka.bootstrap_servers.split(",")[0], 9092, "kafka")
                tls_files(s.kafka.tls, "kafka.tls")
                if s.kafka.sasl_username:
                    mounted(s.kafka.sasl_password_file, "kafka.sasl_password_file")
            if "postgres" in need:
                reach(s.postgres_dsn, 5432, "postgres")
                for key in ("sslrootcert_file", "sslcert_file", "sslkey_file", "password_file"):
                    if getattr(s.postgres, key) is not None:
                        mounted(getattr(s.postgres, key), f"postgres.{key}")
            if "ledger" in need:
                reach(s.ledger_dsn or "chdb://embedded", 8443, "ledger")
                tls_files(s.ledger.tls, "ledger.tls")
                if s.ledger.password_file is not None:
                    mounted(s.ledger.password_file, "ledger.password_file")
            if "openstack" in need and s.provider.kind == "openstack":
                path = env.get("OS_CLIENT_CONFIG_FILE")
                mounted(path, "OS_CLIENT_CONFIG_FILE (clouds.yaml)")
                clouds = yaml.safe_load(inputs.secrets["sco-clouds"]["clouds.yaml"])["clouds"]
                cloud = clouds.get(s.provider.openstack_cloud)
                if cloud is None:
                    out.append(f"{where}: clouds.yaml has no cloud {s.provider.openstack_cloud}")
                else:
                    reach(cloud["auth"]["auth_url"], 443, "openstack")
            if "notice-key" in need:
                mounted(s.notices.signing_key_file, "notices.signing_key_file")
            if "slurm" in need and s.slurm.rest_url:
                reach(s.slurm.rest_url, 6820, "slurmrestd")
                if s.slurm.rest_url.startswith("http"):
                    mounted(s.slurm.rest_token_file, "slurm.rest_token_file")
            if "kubernetes" in need:
                if s.kubernetes.kubeconfig is None:
                    if not spec.get("automountServiceAccountToken", True):
                        out.append(
                            f"{where}: in-cluster Kubernetes config "
                            "but no ServiceAccount token mounted"
                        )
                else:
                    mounted(s.kubernetes.kubeconfig, "kubernetes.kubeconfig")
                    kc = yaml.safe_load(
                        inputs.secrets.get("sco-workload-kubeconfig", {}).get("kubeconfig", "{}")
                    )
                    for cl in kc.get("clusters", []):
                        reach(cl["cluster"]["server"], 443, "workload cluster API")
            if "git" in need:
                for url in (s.contracts.repo_url, *s.contracts.mirror_urls):
                    scheme = url.split("://")[0] if "://" in url else "ssh"
                    reach(url, GIT_PORTS.get(scheme, 443), "git")
                trust = [
                    volumes[m["name"]]["secret"]["secretName"]
                    for m in c.get("volumeMounts", [])
                    if Path(m["mountPath"]) == s.trust_dir and "secret" in volumes[m["name"]]
                ]
                for name in trust:
                    if "allowed_signers" not in inputs.secrets.get(name, {}):
                        out.append(
                            f"{where}: Secret {name} has no allowed_signers: "
                            "every commit would be refused"
                        )
            if "contract-signing-key" in need:
                mounted(s.contracts.signing_key_file, "contracts.signing_key_file")
            if "notice-keys" in need:
                d = s.contracts.notice_keys_dir
                mounted(d / s.region if d else None, "contracts.notice_keys_dir/<region>")
            if "contracts" in need:
                mounted(s.trust_dir, "contracts.trust_dir")
                if c["args"][:2] == ["worker", "--region"] and not any(
                    i["args"][:2] == ["contracts", "pull"] for i in spec.get("initContainers", [])
                ):
                    out.append(
                        f"{where}: nothing pulls the contract bundle before the controllers start"
                    )
    return out


@needs_kubectl
@pytest.mark.parametrize("region", REGIONS)
def test_shipped_overlays_are_consistent(
    region: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = list(render(region))
    inputs = shipped_inputs()
    if region != "r1":
        # The examples document r1's estate; the others differ only in names and CIDRs.
        text = yaml.safe_dump_all(
            [*_docs(EXAMPLES / "secrets.example.yaml"), *_docs(EXAMPLES / "estate.example.yaml")]
        )
        n = {"r2": "21", "r3": "31"}[region]
        text = text.replace("r1", region).replace("10.11.", f"10.{n}.")
        both = list(yaml.safe_load_all(text))
        inputs = Inputs(
            [d for d in both if d["kind"] == "Secret"], [d for d in both if d["kind"] != "Secret"]
        )
    assert problems(docs, inputs, tmp_path, monkeypatch) == []


def _container(docs: list[Doc], prefix: str, name: str | None = None) -> Doc:
    for d in docs:
        if d["kind"] in ("Deployment", "Job") and d["metadata"]["name"].startswith(prefix):
            for c in d["spec"]["template"]["spec"]["containers"]:
                if name is None or c["name"] == name:
                    return dict(c)
    raise AssertionError(prefix)


def _pod(docs: list[Doc], prefix: str) -> Doc:
    (d,) = [
        d
        for d in docs
        if d["kind"] in ("Deployment", "Job") and d["metadata"]["name"].startswith(prefix)
    ]
    spec: Doc = d["spec"]["template"]["spec"]
    return spec


def _policy(docs: list[Doc], name: str) -> Doc:
    (p,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == name]
    return p


def _relay_without_clouds(docs: list[Doc], inputs: Inputs) -> None:
    for c in _pod(docs, "sco-notice-relay-a")["containers"]:
        c["env"] = [e for e in c["env"] if e["name"] != "OS_CLIENT_CONFIG_FILE"]


def _openstack_egress_worker_only(docs: list[Doc], inputs: Inputs) -> None:
    _policy(docs, "allow-openstack-api")["spec"]["podSelector"] = {
        "matchLabels": {"app.kubernetes.io/name": "sco-worker"}
    }


def _one_label_for_nats_and_kafka(docs: list[Doc], inputs: Inputs) -> None:
    rules = _policy(docs, "allow-region-services")["spec"]["egress"]
    for rule, svc in ((rules[1], "nats"), (rules[2], "kafka")):
        rule["to"] = [{"namespaceSelector": {"matchLabels": {"sco.io/estate-service": svc}}}]
    inputs.namespaces["sco-estate"] = {"sco.io/estate-service": "kafka"}  # one key, one value


def _clickhouse_by_namespace(docs: list[Doc], inputs: Inputs) -> None:
    _policy(docs, "allow-clickhouse")["spec"]["egress"][0]["to"] = [
        {"namespaceSelector": {"matchLabels": {"sco.io/estate": "true"}}}
    ]


def _no_bundle_pull(docs: list[Doc], inputs: Inputs) -> None:
    _pod(docs, "sco-worker-").pop("initContainers")


def _slurm_token_not_mounted(docs: list[Doc], inputs: Inputs) -> None:
    for c in _pod(docs, "sco-worker-")["containers"]:
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "slurmrestd-token"]


def _slurm_token_secret_undocumented(docs: list[Doc], inputs: Inputs) -> None:
    del inputs.secrets["sco-slurmrestd"]


def _no_scheduler_egress(docs: list[Doc], inputs: Inputs) -> None:
    docs.remove(_policy(docs, "allow-scheduler-apis"))


def _in_cluster_without_token(docs: list[Doc], inputs: Inputs) -> None:
    cm = next(
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("sco-config")
    )
    cm["data"]["sco.toml"] = cm["data"]["sco.toml"].replace(
        'kubeconfig = "/etc/sco/kube/kubeconfig"', ""
    )


def _no_migration_job(docs: list[Doc], inputs: Inputs) -> None:
    docs[:] = [d for d in docs if not d["metadata"]["name"].startswith("sco-db-migrate-")]


def _no_git_egress(docs: list[Doc], inputs: Inputs) -> None:
    docs.remove(_policy(docs, "allow-contract-git"))


def _git_mirror_not_allowed(docs: list[Doc], inputs: Inputs) -> None:
    rule = _policy(docs, "allow-contract-git")["spec"]["egress"][0]
    rule["to"] = rule["to"][:1]


def _sync_signing_key_not_mounted(docs: list[Doc], inputs: Inputs) -> None:
    for c in _pod(docs, "sco-contract-sync")["containers"]:
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "signing-key"]


def _no_allowed_signers(docs: list[Doc], inputs: Inputs) -> None:
    del inputs.secrets["sco-contract-trust"]["allowed_signers"]


def _sync_without_notice_keys(docs: list[Doc], inputs: Inputs) -> None:
    for c in _pod(docs, "sco-contract-sync")["containers"]:
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "notice-keys"]


PROBES: dict[str, tuple[Callable[[list[Doc], Inputs], None], str]] = {
    "sync-no-git-egress": (
        _no_git_egress,
        "sco-contract-sync/sco-contract-sync: git git.sco.internal:443 is not allowed",
    ),
    "sync-git-mirror-not-allowed": (
        _git_mirror_not_allowed,
        "git git-mirror.sco.internal:443 is not allowed",
    ),
    "sync-signing-key-not-mounted": (
        _sync_signing_key_not_mounted,
        "contracts.signing_key_file /etc/sco/contract-signing/signing.key is not mounted",
    ),
    "sync-no-allowed-signers": (
        _no_allowed_signers,
        "Secret sco-contract-trust has no allowed_signers",
    ),
    "sync-no-notice-keys": (
        _sync_without_notice_keys,
        "contracts.notice_keys_dir/<region> /etc/sco/notice-keys/r1 is not mounted",
    ),
    "relay-no-clouds-yaml": (
        _relay_without_clouds,
        "sco-notice-relay-a/sco-notice-relay: OS_CLIENT_CONFIG_FILE",
    ),
    "relay-no-openstack-egress": (
        _openstack_egress_worker_only,
        "sco-notice-relay-a/sco-notice-relay: openstack",
    ),
    "nats-kafka-label-clash": (
        _one_label_for_nats_and_kafka,
        "nats nats.sco-estate.svc:4222 is not allowed",
    ),
    "clickhouse-by-namespace": (_clickhouse_by_namespace, "ledger clickhouse.r1.sco.internal:8443"),
    "no-bundle-pull": (_no_bundle_pull, "nothing pulls the contract bundle"),
    "slurm-token-not-mounted": (
        _slurm_token_not_mounted,
        "slurm.rest_token_file /etc/sco/slurm/token is not mounted",
    ),
    "slurm-token-secret-missing": (
        _slurm_token_secret_undocumented,
        "Secret sco-slurmrestd not in the documented inputs",
    ),
    "no-scheduler-egress": (_no_scheduler_egress, "slurmrestd slurmrestd.r1.sco.internal:6820"),
    "in-cluster-without-token": (
        _in_cluster_without_token,
        "in-cluster Kubernetes config but no ServiceAccount token",
    ),
    "no-migration-job": (_no_migration_job, "no Job runs `sco db migrate`"),
}


@needs_kubectl
@pytest.mark.parametrize("probe", sorted(PROBES))
def test_each_defect_is_caught(probe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = copy.deepcopy(list(render("r1")))
    inputs = shipped_inputs()
    breaks, expected = PROBES[probe]
    breaks(docs, inputs)
    found = problems(docs, inputs, tmp_path, monkeypatch)
    assert any(expected in p for p in found), found
