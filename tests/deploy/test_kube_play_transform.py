"""`for_podman` (tests/support/kube_play.py): the only change the podman test makes to the
rendered overlay, on the rendering itself and on a small document."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.deploy.test_k8s_manifests import TLS_KINDS, needs_kubectl, render
from tests.support.kube_play import (
    DROPPED_DEPLOYMENTS,
    DROPPED_KINDS,
    MissingSecret,
    PlayInputs,
    for_podman,
)

SECRETS = {
    "sco-secrets": {"SCO_POSTGRES_DSN": "postgresql://x/db", "SCO_LEDGER_DSN": "chdb:///l"},
    "sco-credentials": {"postgres.password": "p", "ledger.password": "l", "kafka.password": "k"},
    **{f"sco-tls-{k}": {"tls.crt": "c", "tls.key": "k", "ca.crt": "a"} for k in TLS_KINDS},
    "sco-nats-control": {"password": "n"},
    **{f"sco-nats-relay-{h}": {"password": "n"} for h in "abcd"},
    "sco-clouds": {"clouds.yaml": "clouds: {}\n"},
    "sco-contract-trust": {"k1.pub": "ab"},
    **{f"sco-notice-key-{h}": {"notice.key": "cd"} for h in "abcd"},
    "sco-slurmrestd": {"token": "t"},
    "sco-workload-kubeconfig": {"kubeconfig": "kind: Config\n"},
}


def _inputs(tmp_path: Path, secrets: dict[str, dict[str, str]] = SECRETS) -> PlayInputs:
    return PlayInputs(
        image="localhost/sco:test",
        secrets=secrets,
        secret_dir=tmp_path / "s",
        env={"SCO_NATS_URL": "nats://10.0.2.2:4222"},
        shared={"/var/lib/sco-ledger": tmp_path / "ledger"},
    )


def _containers(spec: dict[str, object]) -> list[dict[str, object]]:
    return [*spec.get("initContainers", []), *spec["containers"]]  # type: ignore[misc]


def test_a_job_becomes_a_pod_and_secrets_come_from_the_inputs(tmp_path: Path) -> None:
    job = {
        "kind": "Job",
        "metadata": {"name": "migrate"},
        "spec": {
            "backoffLimit": 6,
            "template": {
                "metadata": {"labels": {"app": "m"}},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "containers": [
                        {
                            "name": "m",
                            "image": "registry/sco:1",
                            "env": [
                                {
                                    "name": "DSN",
                                    "valueFrom": {
                                        "secretKeyRef": {
                                            "name": "sco-secrets",
                                            "key": "SCO_POSTGRES_DSN",
                                        }
                                    },
                                }
                            ],
                            "volumeMounts": [{"name": "tok", "mountPath": "/t"}],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "tok",
                            "secret": {
                                "secretName": "sco-slurmrestd",
                                "items": [{"key": "token", "path": "jwt"}],
                            },
                        }
                    ],
                },
            },
        },
    }
    before = copy.deepcopy(job)
    played = for_podman([job], _inputs(tmp_path))
    assert job == before  # the rendering is not changed
    (pod,) = played.docs
    assert played.jobs == ["migrate"]
    assert pod["kind"] == "Pod" and pod["metadata"] == {"name": "migrate", "labels": {"app": "m"}}
    assert pod["spec"]["restartPolicy"] == "Never"
    (c,) = pod["spec"]["containers"]
    assert c["image"] == "localhost/sco:test" and c["imagePullPolicy"] == "Never"
    assert c["env"] == [{"name": "DSN", "value": "postgresql://x/db"}]
    assert {"name": "shared-0", "mountPath": "/var/lib/sco-ledger"} in c["volumeMounts"]
    tok = next(v for v in pod["spec"]["volumes"] if v["name"] == "tok")
    assert tok == {
        "name": "tok",
        "hostPath": {"path": str(tmp_path / "s" / "sco-slurmrestd"), "type": "Directory"},
    }
    assert played.files == {tmp_path / "s" / "sco-slurmrestd" / "jwt": "t"}


def test_a_secret_missing_from_the_inputs_is_an_error(tmp_path: Path) -> None:
    pod_spec = {
        "containers": [
            {
                "name": "c",
                "image": "i",
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}],
            }
        ]
    }
    deployment = {
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {"template": {"spec": pod_spec}},
    }
    with pytest.raises(MissingSecret, match="Secret nope key k"):
        for_podman([deployment], _inputs(tmp_path))


@needs_kubectl
def test_overlay_r1_needs_only_the_documented_secrets_and_keeps_its_shape(tmp_path: Path) -> None:
    rendered = list(render("r1"))
    played = for_podman(rendered, _inputs(tmp_path))
    kinds = [d["kind"] for d in played.docs]
    assert not DROPPED_KINDS & set(kinds)
    assert sorted(played.jobs) == ["sco-db-migrate-0.1.0", "sco-temporal-bootstrap-0.1.0"]
    deployments = [d for d in rendered if d["kind"] == "Deployment"]
    assert len(deployments) == 8
    played_names = {d["metadata"]["name"] for d in played.docs}
    assert {d["metadata"]["name"] for d in deployments} - played_names == DROPPED_DEPLOYMENTS
    assert kinds.count("Deployment") == 7
    region = next(d for d in played.docs if d["metadata"]["name"] == "sco-region")
    assert region["data"]["SCO_NATS_URL"] == "nats://10.0.2.2:4222"
    assert region["data"]["SCO_REGION"] == "r1"  # rendered values stay
    for doc in played.docs:
        if doc["kind"] == "ConfigMap":
            continue
        spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"]
        assert not [v for v in spec["volumes"] if "secret" in v]
        for c in _containers(spec):
            assert c["image"] == "localhost/sco:test"
            assert not [e for e in c.get("env", []) if "valueFrom" in e]  # type: ignore[attr-defined]
    # Commands, probes and security contexts are the rendered ones.
    worker = next(d for d in played.docs if d["metadata"]["name"].startswith("sco-worker-"))
    original = next(d for d in rendered if d["metadata"]["name"] == worker["metadata"]["name"])
    for c, o in zip(
        _containers(worker["spec"]["template"]["spec"]),
        _containers(original["spec"]["template"]["spec"]),
        strict=True,
    ):
        for key in ("command", "args", "securityContext"):
            assert c.get(key) == o.get(key)
        assert "ports" not in c
    containers = worker["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["contracts-pull", "worker", "contracts-refresh"]
    assert "initContainers" not in worker["spec"]["template"]["spec"]
    probe = containers[1]["readinessProbe"]
    assert probe["httpGet"] == {"path": "/readyz", "port": 8080}


def test_plaintext_drops_tls_and_passwords_but_keeps_the_rest() -> None:
    import tomllib

    from tests.deploy.test_k8s_manifests import K8S
    from tests.support.kube_play import plaintext_config
    from workers.settings import Settings

    shipped = (K8S / "base" / "sco.toml").read_text()
    s = Settings(**tomllib.loads(plaintext_config(shipped)))
    assert not (s.nats_tls.enabled or s.temporal.tls.enabled or s.kafka.tls.enabled)
    assert not (s.ledger.tls.enabled or s.postgres.sslmode or s.postgres.password_file)
    assert not s.kafka.sasl_username and s.ledger.password_file is None
    assert s.worker.versioning and s.kafka.replication_factor == 3


def test_plaintext_services_drop_only_theirs() -> None:
    """Against the secure box: Kafka and the ledger plaintext, NATS, Temporal and
    PostgreSQL keep their TLS, client certificates and password files."""
    import tomllib

    from tests.deploy.test_k8s_manifests import K8S
    from tests.support.kube_play import plaintext_config
    from workers.settings import Settings

    shipped = (K8S / "base" / "sco.toml").read_text()
    s = Settings(**tomllib.loads(plaintext_config(shipped, frozenset({"kafka", "ledger"}))))
    assert not (s.kafka.tls.enabled or s.kafka.sasl_username or s.kafka.sasl_password_file)
    assert not s.ledger.tls.enabled and s.ledger.password_file is None
    assert s.nats_tls.enabled and s.nats_tls.client_cert_file and s.temporal.tls.enabled
    assert s.postgres.sslmode == "verify-full" and s.postgres.password_file
    assert s.nats_auth.password_file


def test_kafka_sasl_drops_the_sasl_user_and_keeps_kafkas_mutual_tls() -> None:
    """The secure box's Kafka (nginx's mutual TLS in front of tansu) takes the client
    certificate and has no SASL: `kafka_sasl` drops the user and its password file only."""
    import tomllib

    from tests.deploy.test_k8s_manifests import K8S
    from tests.support.kube_play import plaintext_config
    from workers.settings import Settings

    shipped = (K8S / "base" / "sco.toml").read_text()
    s = Settings(**tomllib.loads(plaintext_config(shipped, frozenset({"kafka_sasl"}))))
    assert not (s.kafka.sasl_username or s.kafka.sasl_password_file)
    t = s.kafka.tls
    assert t.enabled and t.ca_file and t.client_cert_file and t.client_key_file
    assert s.kafka.bootstrap_servers == "kafka-bootstrap.sco-estate.svc:9092"


@needs_kubectl
def test_a_containers_own_env_wins_over_its_config_map_as_in_kubernetes(tmp_path: Path) -> None:
    # podman 4.3.1 lets envFrom override env: each hall's relay ran as the region's NATS
    # user (control-r1), which the secure box's permissions refused.
    played = for_podman(list(render("r1")), _inputs(tmp_path))
    relay = next(d for d in played.docs if d["metadata"]["name"] == "sco-notice-relay-b")
    (c,) = relay["spec"]["template"]["spec"]["containers"]
    assert "envFrom" not in c
    env = {e["name"]: e["value"] for e in c["env"]}
    assert len(env) == len(c["env"])  # one entry per name: nothing left for podman to order
    assert env["SCO_NATS_AUTH__USER"] == "relay-r1-B"
    assert env["SCO_NATS_URL"] == "nats://10.0.2.2:4222"  # the ConfigMap's, with the inputs
    assert env["SCO_REGION"] == "r1"
