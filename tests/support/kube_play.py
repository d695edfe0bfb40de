"""The rendered overlay, made runnable by `podman kube play` on one box (no API server).

`for_podman` is the only place the rendered manifests are changed; every change is a
deviation from the real cluster, listed here and in tests/deploy/README.md:

- Namespace, ServiceAccount, NetworkPolicy and PodDisruptionBudget are dropped: podman
  has no API server to enforce them (tests/deploy/test_deploy_consistency.py checks them).
- A Job becomes a Pod of the same spec with restartPolicy Never (kube play runs no Jobs;
  backoffLimit and ttlSecondsAfterFinished are not emulated): the test waits for its exit.
- Every image becomes the locally built tag (no registry here), pulled never.
- Secrets come from the test's inputs, as a cluster's secret store would create them:
  a `secretKeyRef` becomes the literal value (kube play mangles `kind: Secret`), a secret
  volume a host directory holding the same keys, owned by the pods' uid (what fsGroup does).
  A Secret the inputs lack is an error: every Secret a pod needs must be a documented input.
- Against the plaintext box (`plaintext`) sco.toml loses its TLS tables and service
  passwords; against the secure box only the services it runs without TLS
  (`plaintext_services`: the ledger's embedded chDB) do, the NATS password file goes
  (`nats_password`: the box's NATS maps the certificate to the user and refuses a CONNECT
  that carries a password too) and Kafka's SASL user (`kafka_sasl`: the box's Kafka takes
  the client certificate, nginx's mutual TLS, and has no SASL).
- The `sco-region` ConfigMap gets the box's service addresses (`env`) as SCO_* variables:
  the cluster's service names (nats.sco-estate.svc, ...) do not resolve here.
- A container's `envFrom` ConfigMap becomes plain `env` entries, its own `env` winning as
  in Kubernetes: podman 4.3.1 lets `envFrom` override `env` (each hall's relay got the
  region's NATS user instead of its own).
- `shared` host directories are mounted into every container (the ledger's embedded store,
  which stands in for the ClickHouse server the box does not run).
- Container ports are dropped (a probe's named port becomes its number): kube play 4.3
  publishes each on the host, where the pods' equal ports collide. Each pod has its own
  network namespace, where the ports are as rendered.
- An emptyDir becomes a volume named `<pod>-<name>`: kube play 4.3 makes a named volume
  called after the emptyDir, which every pod's `data` or `tmp` would share.
- Init containers run first among the pod's containers, beside them rather than before:
  podman 4.3.1 with runc fails the pod when it removes a finished init container. The
  worker's `contracts-pull` thus races its `worker`, which starts without a bundle and
  plans once the sidecar or the pull has fetched one.
- A ConfigMap key mounted by `subPath` becomes a host file mounted in its place: kube play
  4.3 mounts the whole ConfigMap as a directory there. Other ConfigMap mounts stay.
- Scheduling (affinity, topology spread) is left as rendered: one host, kube play ignores it.
- The contract sync's Deployment is dropped: it needs a git server holding signed commits,
  which this run does not start; the run publishes the bundle itself, as an operator's
  `sco contracts publish` would. The sync is tested against real git servers in
  tests/contracts/test_contract_git_sync.py, its signature check in the image by
  tests/deploy/test_image.py, its manifest by test_k8s_manifests/test_deploy_consistency.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Doc = dict[str, Any]
#: Kinds podman cannot run or enforce; dropped.
# The Prometheus Operator's kinds (PodMonitor, PrometheusRule) only configure a
# Prometheus: no operator runs here, and the rules have their own promtool tests.
DROPPED_KINDS = frozenset(
    {
        "Namespace",
        "ServiceAccount",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PodMonitor",
        "PrometheusRule",
    }
)
REGION_CONFIGMAP = "sco-region"
#: Deployments not run here (see the module's doc): the contract sync (no git server).
DROPPED_DEPLOYMENTS = frozenset({"sco-contract-sync"})


class MissingSecret(KeyError):
    """A pod names a Secret (or key) the test inputs do not provide."""


@dataclass(frozen=True)
class PlayInputs:
    image: str
    secrets: dict[str, dict[str, str]]  # Secret name -> key -> value
    secret_dir: Path  # host directory under which secret volumes are written
    env: dict[str, str] = field(default_factory=dict)  # added to the sco-region ConfigMap
    shared: dict[str, Path] = field(default_factory=dict)  # mount path -> host directory
    # The box's services speak plaintext on loopback: drop sco.toml's TLS and passwords.
    plaintext: bool = False
    # Only these of the box's services speak plaintext (the secure box's ledger, an embedded
    # chDB): their TLS tables and passwords are dropped, the others kept; `nats_password`
    # and `kafka_sasl` drop only a password (the certificate names the client).
    plaintext_services: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Played:
    docs: list[Doc]  # ConfigMaps, Deployments and the Jobs' Pods, in rendered order
    files: dict[Path, str]  # secret files to write (0644 files, dirs owned by the pods' uid)
    jobs: list[str]  # names of the Pods made from Jobs
    volumes: list[str]  # the named volumes standing in for emptyDirs (remove them after)


def _secret(inputs: PlayInputs, name: str, key: str) -> str:
    try:
        return inputs.secrets[name][key]
    except KeyError:
        raise MissingSecret(f"Secret {name} key {key} is not among the test inputs") from None


def _pod_spec(
    pod: str,
    spec: Doc,
    inputs: PlayInputs,
    files: dict[Path, str],
    configmaps: dict[str, dict[str, str]],
    named: list[str],
) -> None:
    by_name = {v["name"]: v for v in spec.get("volumes", [])}
    volumes: list[Doc] = []
    # kube play 4.3 makes an emptyDir a named volume called after it, so every pod's
    # `data` would be one volume: each pod gets its own, `<pod>-<name>`.
    renamed = {n: f"{pod}-{n}" for n, v in by_name.items() if "emptyDir" in v}
    named += renamed.values()
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for mount in container.get("volumeMounts", []):
            mount["name"] = renamed.get(mount["name"], mount["name"])
    for old, new in renamed.items():
        by_name[old]["name"] = new
        by_name[new] = by_name.pop(old)
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for mount in container.get("volumeMounts", []):
            cm = by_name.get(mount["name"], {}).get("configMap")
            if cm is None or "subPath" not in mount:
                continue
            host = inputs.secret_dir / "configmaps" / cm["name"] / mount["subPath"]
            files[host] = configmaps[cm["name"]][mount["subPath"]]
            name = f"{mount['name']}-{len(volumes)}"
            volumes.append({"name": name, "hostPath": {"path": str(host), "type": "File"}})
            mount["name"] = name
            del mount["subPath"]
    for vol in spec.get("volumes", []):
        if "secret" in vol:
            name = vol["secret"]["secretName"]
            host = inputs.secret_dir / name
            items = vol["secret"].get("items") or [
                {"key": k, "path": k} for k in sorted(inputs.secrets.get(name, {}))
            ]
            if name not in inputs.secrets:
                raise MissingSecret(f"Secret {name} is not among the test inputs")
            for item in items:
                files[host / item["path"]] = _secret(inputs, name, item["key"])
            vol = {"name": vol["name"], "hostPath": {"path": str(host), "type": "Directory"}}
        volumes.append(vol)
    for i, mount_path in enumerate(inputs.shared):
        volumes.append(
            {"name": f"shared-{i}", "hostPath": {"path": str(inputs.shared[mount_path])}}
        )
    spec["volumes"] = volumes
    # podman 4.3.1 with runc fails the pod when it removes a finished init container
    # ("cannot remove container ... as it is running"): they run beside the others.
    spec["containers"] = [*spec.pop("initContainers", []), *spec["containers"]]
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        _unpublish(container)
        container["image"] = inputs.image
        container["imagePullPolicy"] = "Never"
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                env.pop("valueFrom")
                env["value"] = _secret(inputs, ref["name"], ref["key"])
        mounts = container.setdefault("volumeMounts", [])
        mounts += [{"name": f"shared-{i}", "mountPath": p} for i, p in enumerate(inputs.shared)]
        _env_from_as_env(container, configmaps)


#: What Kubernetes takes from a ConfigMap's keys as environment variable names.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_from_as_env(container: Doc, configmaps: dict[str, dict[str, str]]) -> None:
    """A ConfigMap's `envFrom` as plain `env` entries, the container's own `env` winning.
    Kubernetes gives `env` precedence over `envFrom`; podman 4.3.1 the reverse, which gave
    every hall's relay the region's `SCO_NATS_AUTH__USER` (control-r1) instead of its own."""
    refs = container.pop("envFrom", [])
    own = container.setdefault("env", [])
    names = {e["name"] for e in own}
    expanded: list[Doc] = []
    for ref in refs:
        cm = ref.get("configMapRef")
        if cm is None:
            raise ValueError(f"envFrom {ref}: only configMapRef is played here")
        prefix = ref.get("prefix", "")
        for key, value in configmaps[cm["name"]].items():
            name = prefix + key
            if _ENV_NAME.fullmatch(name) and name not in names:
                expanded.append({"name": name, "value": value})
                names.add(name)
    container["env"] = [*expanded, *own]


def _unpublish(container: Doc) -> None:
    """Drop the container's ports, a probe's named port becoming its number."""
    numbers = {p["name"]: p["containerPort"] for p in container.pop("ports", []) if "name" in p}
    for key in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = container.get(key, {}).get("httpGet")
        if get is not None and isinstance(get["port"], str):
            get["port"] = numbers[get["port"]]


#: Per service, the sco.toml tables that configure its TLS or password.
_TLS_TABLES = {
    "nats": "nats_tls",
    "postgres": "postgres",
    "ledger": "ledger.tls",
    "temporal": "temporal.tls",
    "kafka": "kafka.tls",
}
#: Per service, its table and the keys there that name a password. `nats_password`: the
#: secure box's NATS takes the user from the client certificate (`verify_and_map`) and
#: refuses a CONNECT that also carries a user and password; `kafka_sasl`: the secure box's
#: Kafka verifies the client certificate (nginx's mutual TLS) and has no SASL users.
_PASSWORD_KEYS = {
    "kafka": ("kafka", ("sasl_",)),
    "kafka_sasl": ("kafka", ("sasl_",)),
    "ledger": ("ledger", ("password_file",)),
    "nats_password": ("nats_auth", ("password_file",)),
}
SERVICES = frozenset(_TLS_TABLES)


def plaintext_config(text: str, services: frozenset[str] = SERVICES) -> str:
    """The shipped sco.toml without the TLS tables, SASL and passwords of `services` (the
    NATS user's password file stays: a server without authorization accepts any user)."""
    tables = {_TLS_TABLES[s] for s in services if s in _TLS_TABLES}
    passwords = dict(_PASSWORD_KEYS[s] for s in services if s in _PASSWORD_KEYS)
    out: list[str] = []
    table = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            table = stripped.strip("[]")
        if table in tables:
            continue
        if stripped.startswith(passwords.get(table, ("\0",))):
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def for_podman(rendered: list[Doc], inputs: PlayInputs) -> Played:
    """The rendered documents as kube play runs them, the secret files they mount, and
    which Pods were Jobs. `rendered` is not changed."""
    docs: list[Doc] = []
    files: dict[Path, str] = {}
    jobs: list[str] = []
    named: list[str] = []
    rendered = copy.deepcopy(rendered)
    plain = SERVICES if inputs.plaintext else inputs.plaintext_services
    if plain:
        for d in rendered:
            if d["kind"] == "ConfigMap" and "sco.toml" in d.get("data", {}):
                d["data"]["sco.toml"] = plaintext_config(d["data"]["sco.toml"], plain)
    configmaps = {
        d["metadata"]["name"]: {
            **d.get("data", {}),
            **(inputs.env if d["metadata"]["name"] == REGION_CONFIGMAP else {}),
        }
        for d in rendered
        if d["kind"] == "ConfigMap"
    }
    for original in rendered:
        doc = copy.deepcopy(original)
        kind = doc["kind"]
        if kind in DROPPED_KINDS:
            continue
        if kind == "Deployment" and doc["metadata"]["name"] in DROPPED_DEPLOYMENTS:
            continue
        if kind == "ConfigMap":
            if doc["metadata"]["name"] == REGION_CONFIGMAP:
                doc["data"] = {**doc.get("data", {}), **inputs.env}
        elif kind == "Deployment":
            name = doc["metadata"]["name"]
            _pod_spec(name, doc["spec"]["template"]["spec"], inputs, files, configmaps, named)
        elif kind == "Job":
            template = doc["spec"]["template"]
            spec = template["spec"]
            spec["restartPolicy"] = "Never"
            name = doc["metadata"]["name"]
            _pod_spec(name, spec, inputs, files, configmaps, named)
            doc = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": template["metadata"].get("labels", {})},
                "spec": spec,
            }
            jobs.append(name)
        else:
            raise ValueError(f"{kind} {doc['metadata']['name']}: not a kind kube play runs here")
        docs.append(doc)
    return Played(docs, files, jobs, named)
