"""The region as shipped, in one test (issue 30):

- the secure region in a box (`sco dev up --profile secure`, without its own processes):
  TLS-only PostgreSQL, NATS mapping each certificate's SPIFFE ID to its role's user,
  Temporal and Kafka (tansu on loopback) behind nginx's mutual TLS, OpenBao;
- overlay r1 rendered as shipped with TLS on, under `podman kube play` against it: the
  migration and bootstrap Jobs, then every Deployment (worker x3, each hall's notice relay,
  the outbox relay, the ledger consumer with the drain intake), each with its own kind's
  certificate (`spiffe://sco/r1/<kind>`, a hall's relay `spiffe://sco/r1/notice-relay/<H>`)
  and each hall's relay with its own notice key, until every pod's health endpoint answers;
- `sco pools sync` and `sco demand set ci-runners 8` as the operator: the pods' controller
  acquires the instances the nodes are (the simulated cloud, served by the test over mTLS
  NATS, stands in for the region's OpenStack);
- two fresh Debian 12 node containers that install the agent's `.deb` and run the unit's
  command lines as its User, each enrolled with `sco dev certs node` (its own certificate,
  `spiffe://sco/r1/node/<instance>`, and the agent's NATS permissions), each running a
  workload as its own unprivileged user, registered on the agent's checkpoint socket;
- `sco checkpoints provision --openbao-region r1`: llm-train's RGW user and bucket on a
  real Ceph RGW, its keys kept in OpenBao; tenant1 gets a token with that contract's policy
  only, and job 1 reads its keys from OpenBao and checkpoints to RGW;
- `sco reclaim` of node 1's instance with the operator's certificate: its hall's relay pod
  signs the notice with its hall's key, node 1's agent hears it over mutual-TLS NATS and
  drains: the workload checkpoints to RGW and exits (`sco checkpoints list` shows the
  step); the job resumes on node 2 from that checkpoint at the same step; the pods'
  controller replaces the reclaimed instance (demand unchanged);
- `sco dev certs revoke` of node 1's identity: the box's NATS reloads and refuses node 1's
  certificate, while node 2's still subscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest
from nats.aio.client import Client as NATSClient
from nats.aio.msg import Msg

from activities.events import InstanceState
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository
from activities.provider.sim_service import serve
from activities.provider.simulator import SimulatedCloud
from agent.report import drain_subject
from contracts.distribution import publish
from contracts.region import Region as RegionCatalogue
from tests.deploy.test_k8s_manifests import TLS_KINDS, render
from tests.deploy.test_kube_play import (
    LEDGER_MOUNT,
    SignedBundle,
    _host_address,
    image,  # noqa: F401 -- the fixture: the session's image, plus the ledger layer
    logs,
    make_build_current,
    notice_key_secrets,
    play_region,
    played_parts,
    pod_names,
    signed_bundle,
    teardown,
    write_secret_files,
)
from tests.support import services
from tests.support.deb_node import as_the_unit_runs_it, podman
from tests.support.kube_play import Doc, PlayInputs, for_podman
from tests.support.paths import REPO
from tests.support.rgw import RgwCluster
from tests.support.secure_box_env import (
    need_servers,
    operator_env,
    operator_settings,
    secure_box_up,
)
from tests.support.wait import WaitTimeout, eventually
from workers.client_security import nats_options, postgres_conninfo
from workers.devbox import openbao
from workers.devbox.secure import BOX_KIND, POD_HOST, SecureProfile
from workers.openbao import checkpoint_secrets
from workers.settings import Settings
from workers.temporal_connect import connect

pytestmark = [
    pytest.mark.devbox,
    pytest.mark.tools(
        "podman", "runc", "slirp4netns", "debootstrap", "nginx", "libnginx-mod-stream", "kubectl"
    ),
    pytest.mark.timeout(900),
]
WORKLOAD = REPO / "tests" / "support" / "node_workload.py"
#: The contract whose demand the controller serves (the box's bundle: contracts/examples).
DEMAND_CONTRACT = "ci-runners"
#: Tenants of the nodes (the same uids on every node, as a directory service would give).
TENANTS = {"tenant1": 20001, "tenant2": 20002}


@dataclass(frozen=True)
class Region:
    env: dict[str, str]  # the box's SCO_* environment (`sco dev ...`)
    profile: SecureProfile
    operator: Settings
    operator_file: Path
    control: Settings  # the box's own identity (control-r1's permissions)
    database: str  # the fleet database's name on the box's TLS PostgreSQL
    kafka: str  # host address:port (nginx's mutual TLS, which tansu advertises): pods and
    # host reach it alike


def _settings_from(env: dict[str, str]) -> Settings:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        return Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SCO_")}


@pytest.fixture(scope="module")
def region() -> Iterator[Region]:
    """The secure box without its own processes: the overlay's pods are the region."""
    need_servers()
    kafka = f"{_host_address()}:{services.free_port()}"  # the pods reach it through slirp
    with secure_box_up("region", extra={"SCO_KAFKA__BOOTSTRAP_SERVERS": kafka}) as (box, env):
        assert box.secure is not None
        operator_file = Path(box.operator_settings_files()["r1"])
        yield Region(
            {**_plain_env(), **env},
            box.secure,
            operator_settings(operator_file),
            operator_file,
            box.secure.settings_for(BOX_KIND, "r1"),
            env["SCO_POSTGRES_DSN"].rsplit("/", 1)[1],
            kafka,
        )


# -- the overlay's pods -------------------------------------------------------------------


def spiffe_kind(secret_kind: str) -> str:
    """The identity kind a `sco-tls-<kind>` Secret holds: a hall's relay `notice-relay/<H>`."""
    if secret_kind.startswith("notice-relay-"):
        return f"notice-relay/{secret_kind.rsplit('-', 1)[1].upper()}"
    return secret_kind


def secure_inputs(root: Path, r: Region, tag: str, bundle: SignedBundle) -> PlayInputs:
    """The documented Secrets with the secure box's values: each kind's certificate from the
    box's CA, PostgreSQL's password, the bundle's trust key and each hall's notice key; NATS
    users come from the certificates (the password files are mounted but the box's
    `verify_and_map` ignores them)."""
    p = r.profile
    ca = p.issuer.ca_file.read_text()
    tls = {}
    for kind in TLS_KINDS:
        issued = p.issuer.issue(spiffe_kind(kind), "r1")
        tls[f"sco-tls-{kind}"] = {
            "tls.crt": issued.cert_path.read_text(),
            "tls.key": issued.key_path.read_text(),
            "ca.crt": ca,
        }
    ledger = root / "ledger"
    ledger.mkdir(mode=0o777)
    os.chmod(ledger, 0o777)  # the pods run as 10001
    return PlayInputs(
        image=tag,
        secrets={
            "sco-credentials": {
                "postgres.password": p.postgres_password_file.read_text(),
                "ledger.password": "unused-the-ledger-is-embedded",
                "kafka.password": "unused-the-box-kafka-has-no-sasl",
            },
            **tls,
            "sco-nats-control": {"password": "unused-the-user-is-the-certificate"},
            **{f"sco-nats-relay-{h}": {"password": "unused"} for h in "abcd"},
            "sco-clouds": {"clouds.yaml": "clouds: {}\n"},  # unused: the simulated cloud
            "sco-slurmrestd": {"token": "unused-slurm-intake-is-off"},
            "sco-workload-kubeconfig": {"kubeconfig": "apiVersion: v1\nkind: Config\n"},
            "sco-contract-trust": {bundle.pub.name: bundle.pub.read_text()},
            **notice_key_secrets(bundle),
        },
        secret_dir=root / "secrets",
        env={
            "SCO_NATS_URL": f"tls://{POD_HOST}:{p.nats_port}",
            "SCO_TEMPORAL__ADDRESS": f"{POD_HOST}:{p.temporal_port}",
            "SCO_POSTGRES_DSN": f"postgresql://postgres@{POD_HOST}:{p.postgres_port}/{r.database}",
            "SCO_KAFKA__BOOTSTRAP_SERVERS": r.kafka,
            "SCO_KAFKA__REPLICATION_FACTOR": "1",
            "SCO_LEDGER_DSN": f"chdb://{LEDGER_MOUNT}/ledger",
            # The simulated cloud stands in for the region's OpenStack.
            "SCO_PROVIDER__KIND": "simulator",
        },
        shared={LEDGER_MOUNT: ledger},
        # The box's NATS user is the certificate's: no password is sent (it would refuse it).
        # Its Kafka verifies the certificate (nginx's mutual TLS) and has no SASL users.
        plaintext_services=frozenset({"kafka_sasl", "ledger", "nats_password"}),
    )


class SimulatedCloudThread:
    """The region's cloud for the pods: the simulated cloud served over mTLS NATS as the
    box's own identity, on an event loop of its own while the test's steps block."""

    def __init__(self, catalogue: RegionCatalogue, control: Settings) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._catalogue, self._control = catalogue, control
        self._task: asyncio.Task[None] | None = None
        self._nc: NATSClient | None = None

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=60)

    async def _start(self) -> None:
        cloud = SimulatedCloud(self._catalogue, clock=self._loop.time)
        c = self._control
        self._nc = await nats.connect(c.nats_url, connect_timeout=5, **nats_options(c))
        self._task = asyncio.create_task(serve(cloud, self._nc))

    async def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._nc is not None:
            await self._nc.close()

    def __enter__(self) -> SimulatedCloudThread:
        self._thread.start()
        self._call(self._start())
        return self

    def __exit__(self, *_exc: object) -> None:
        try:
            self._call(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)


async def _make_current(r: Region, deployments: list[Doc]) -> None:
    client = await connect(r.control, "r1")  # the box's own identity
    await make_build_current(client, deployments)


@contextlib.contextmanager
def played_region(r: Region, tag: str, bundle: SignedBundle, root: Path) -> Iterator[list[Doc]]:
    """Overlay r1 rendered as shipped, TLS on, played: the Jobs to exit 0, every Deployment
    until its health endpoint answers, the build made current. Yields the Deployments (for
    their logs); takes every pod down after."""
    played = for_podman(list(render("r1")), secure_inputs(root, r, tag, bundle))
    write_secret_files(played)
    configmaps, jobs, deployments = played_parts(played)
    played_files: list[Path] = []
    try:
        asyncio.run(play_region(jobs, deployments, configmaps, root, played_files))
        asyncio.run(_make_current(r, deployments))
        yield deployments
    finally:
        teardown(
            list(reversed(played_files)),
            [pod for d in [*jobs, *deployments] for pod in pod_names(d)],
            [d["metadata"]["name"] for d in configmaps] + played.volumes,
        )


def _sco(env: dict[str, str], *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env=env, cwd=REPO, text=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, f"sco {' '.join(args)}: {out.stdout}{out.stderr}"
    return out.stdout


# -- the nodes ----------------------------------------------------------------------------


@dataclass
class Node:
    name: str  # the instance id: the agent's node_id, the notice's node
    hall: str
    container: str
    files: Path
    cert: dict[str, str]  # `sco dev certs node --json`

    def logs(self) -> str:
        out = podman("logs", self.container, timeout=60)
        return out.stdout + out.stderr

    def sh(self, script: str, *, detach: bool = False) -> subprocess.CompletedProcess[str]:
        return podman("exec", *(["-d"] if detach else []), self.container, "sh", "-c", script)


def _node_script(pub: str) -> str:
    """dpkg -i, the node's config and certificate, its tenants, then the unit's command
    lines (tests/support/deb_node.py)."""
    users = "".join(
        f"useradd --uid {uid} --user-group --no-create-home --shell /usr/sbin/nologin {name}\n"
        for name, uid in TENANTS.items()
    )
    return (
        "set -e\n"
        "dpkg -i /node/sco-agent.deb\n"
        "install -m 0640 -g sco-agent /node/agent.toml /etc/sco-agent/agent.toml\n"
        f"install -m 0644 /node/{pub} /etc/sco-agent/trust/\n"
        "install -d -m 0750 -g sco-agent /etc/sco-agent/tls\n"
        "install -m 0644 /node/tls/ca.crt /node/tls/node.crt /etc/sco-agent/tls/\n"
        "install -m 0640 -g sco-agent /node/tls/node.key /etc/sco-agent/tls/\n"
        + users
        + as_the_unit_runs_it()
    )


def _start_node(
    r: Region, name: str, hall: str, deb: Path, node_image: str, root: Path, store: Path, pub: Path
) -> Node:
    """A node container for the instance `name`: the `.deb`, its certificate, the bundle's
    trust key `pub`, the agent as the unit runs it."""
    cert = json.loads(
        _sco(r.env, "dev", "certs", "node", name, "--hall", hall, "--region", "r1", "--json")
    )
    files = root / name
    (files / "tls").mkdir(parents=True)
    shutil.copy(deb, files / "sco-agent.deb")
    shutil.copy(cert["nats_tls_ca"], files / "tls" / "ca.crt")
    shutil.copy(cert["nats_tls_cert"], files / "tls" / "node.crt")
    shutil.copy(cert["nats_tls_key"], files / "tls" / "node.key")
    os.chmod(files / "tls" / "node.key", 0o644)  # installed 0640 root:sco-agent on the node
    shutil.copy(WORKLOAD, files / "workload.py")
    shutil.copy(pub, files / pub.name)
    (files / "agent.toml").write_text(
        f'node_id = "{name}"\nregion = "r1"\nhall = "{hall}"\nscheduler = "none"\n'
        f'nats_urls = ["{cert["nats_url"]}"]\n'
        'nats_tls_ca = "/etc/sco-agent/tls/ca.crt"\n'
        'nats_tls_cert = "/etc/sco-agent/tls/node.crt"\n'
        'nats_tls_key = "/etc/sco-agent/tls/node.key"\n'
    )
    (files / "start.sh").write_text(_node_script(pub.name))
    container = f"sco-region-{uuid.uuid4().hex[:8]}"
    run = podman(
        "run", "-d", "--name", container, "--network", "host",
        "-v", f"{files}:/node:ro", "-v", f"{store}:/ckpt",
        node_image, "sh", "/node/start.sh",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return Node(name, hall, container, files, cert)


def _agent_ready(node: Node) -> None:
    def started() -> bool:
        out = node.logs()
        if "ready to drain" in out:
            return True
        state = podman("inspect", "-f", "{{.State.Status}}", node.container).stdout.strip()
        assert state == "running", out
        return False

    try:
        eventually(started, timeout=240, what=f"{node.name}'s agent", every=0.5, retrying=())
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}\n{node.logs()}") from exc


@dataclass(frozen=True)
class RgwStore:
    """Where a job's checkpoints go on RGW: its contract's secret in OpenBao, read with the
    tenant's token (host paths, copied into the node's files at the job's start)."""

    address: str  # OpenBao's, reached from the node (host network)
    ca: Path
    tokens: dict[str, str]  # tenant -> a token with the contract's policy only
    path: str  # sco/data/r1/checkpoints/<contract>
    # This run's jobs under the contract's prefix: the session's RGW is shared with other
    # tests of llm-train's bucket (tests/workers/test_cli_checkpoints.py has a job-1 too).
    run: str = field(default_factory=lambda: f"region-{uuid.uuid4().hex[:8]}")

    def job_dir(self, job: str) -> str:
        return f"{self.run}-{job}"


def _run_job(node: Node, job: str, tenant: str, rgw: RgwStore | None = None) -> Path:
    """The job as `tenant` on the node: its checkpoint directory made as the scheduler-less
    agent's README says (the tenant's, group sco-agent, 0770), then the workload (its
    checkpoints on RGW with `rgw`, else in the shared directory). Returns the host path of
    its status file."""
    sock_dir = f"/run/sco-agent/checkpoint/{job}"
    made = node.sh(f"install -d -o {tenant} -g sco-agent -m 0770 {sock_dir}")
    assert made.returncode == 0, made.stderr
    store = f"--store /ckpt/{job}"
    if rgw is not None:  # the tenant's token, readable by the tenant only
        (node.files / f"{tenant}.token").write_text(rgw.tokens[tenant])
        shutil.copy(rgw.ca, node.files / "bao-ca.pem")
        secret = f"/run/sco-tenant/{tenant}.token"
        made = node.sh(
            f"install -d -m 0755 /run/sco-tenant && "
            f"install -o {tenant} -g {tenant} -m 0400 /node/{tenant}.token {secret}"
        )
        assert made.returncode == 0, made.stderr
        store = (
            f"--store {rgw.job_dir(job)} --bao {rgw.address} --bao-ca /node/bao-ca.pem "
            f"--bao-token-file {secret} --bao-path {rgw.path}"
        )
    run = (
        f"cd / && exec setpriv --reuid={tenant} --regid={tenant} --init-groups "
        f"env PYTHONPATH=/usr/lib/sco-agent python3 /node/workload.py --socket {sock_dir}/sock "
        f"{store} --status /ckpt/{job}.{node.name}.json "
        f">/ckpt/{job}.{node.name}.log 2>&1"
    )
    started = node.sh(run, detach=True)
    assert started.returncode == 0, started.stderr
    return Path(f"{job}.{node.name}.json")


def _rgw_store(r: Region, rgw: RgwCluster, root: Path) -> RgwStore:
    """`sco checkpoints provision --openbao-region r1` over the box's bundle, as the
    operator runs it: llm-train's RGW user, bucket and keys, the keys kept in OpenBao; then
    tenant1's token with that contract's policy (what the site's login would give it)."""
    bundle = r.control.data_dir / "contracts" / "compiled" / "bundle.json"
    out = _sco(
        r.env, "checkpoints", "provision", str(bundle), "--trust", str(r.control.trust_dir),
        "--endpoint", rgw.endpoint, "--ceph-conf", str(rgw.ceph_conf),
        "--credentials", str(root / "checkpoint-keys"), "--openbao-region", "r1", "--json",
    )  # fmt: skip
    (row,) = [x for x in json.loads(out) if x["contract"] == "llm-train"]
    box = _settings_from(r.env)
    admin = openbao.client(box)
    policy = checkpoint_secrets.policy_name("r1", "llm-train")
    assert row["openbao"].endswith(f"(policy {policy})"), row
    return RgwStore(
        box.openbao.address,
        openbao.BoxFiles(box.data_dir).ca,
        {"tenant1": admin.create_token([policy])},
        checkpoint_secrets.data_path("r1", "llm-train"),
    )


def _status(store: Path, name: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads((store / name).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return doc


# -- NATS as a given identity -------------------------------------------------------------


def _tls(r: Region, cert: dict[str, str]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=cert["nats_tls_ca"])
    ctx.load_cert_chain(cert["nats_tls_cert"], cert["nats_tls_key"])
    return ctx


async def _subscribes(r: Region, node: Node) -> None:
    """Connect with the node's certificate and subscribe to its own notice subject (what its
    agent does); raises when the server refuses either."""
    errors: list[Exception] = []

    async def seen(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(
        r.control.nats_url,
        tls=_tls(r, node.cert),
        connect_timeout=5,
        allow_reconnect=False,
        max_reconnect_attempts=0,
        error_cb=seen,
        inbox_prefix=f"_INBOX_{node.name}",
    )
    try:
        await nc.subscribe(f"sco.r1.notice.{node.hall}.{node.name}")
        await nc.flush(timeout=5)
        # The server answers the SUB's -ERR before the PONG; its error callback is a task
        # the client schedules when it parses the -ERR: one more round trip lets it run.
        await nc.flush(timeout=5)
        if errors:
            raise errors[0]
    finally:
        await nc.close()


# -- the test -----------------------------------------------------------------------------


def _ci_runners(r: Region) -> dict[str, str]:
    """ci-runners' active instances, instance id -> hall."""
    pool = open_pool(postgres_conninfo(r.operator), max_size=1)
    try:
        rows = FleetRepository(pool).list_instances("r1", [InstanceState.ACTIVE])
    finally:
        pool.close()
    return {row.instance_id: row.hall for row in rows if row.workload == DEMAND_CONTRACT}


def _demand(r: Region, deployments: list[Doc]) -> dict[str, str]:
    """As an operator: `sco pools sync`, `sco demand set`; the pods' controller acquires.
    Returns the contract's first active instances (id -> hall), at least two."""
    env = operator_env(r.operator_file)
    _sco(env, "pools", "sync", "--region", "r1")
    _sco(env, "demand", "set", DEMAND_CONTRACT, "8", "--region", "r1", "--by", "test")

    def served() -> bool:  # nothing in flight any more (a later instance is a replacement)
        in_flight = json.loads(
            _sco(env, "acquisitions", "list", "--region", "r1", "--contract", DEMAND_CONTRACT,
                 "--json")
        )  # fmt: skip
        return not in_flight and len(_ci_runners(r)) >= 2

    try:
        eventually(served, timeout=240, what="the demand served", every=2, retrying=())
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}\n{logs(deployments)}") from exc
    return _ci_runners(r)


@dataclass(frozen=True)
class Reclaimed:
    notice: dict[str, Any]  # the signed envelope the hall's relay published
    report: dict[str, Any]  # the node's drain report


async def _reclaim_and_report(r: Region, node: Node, deployments: list[Doc]) -> Reclaimed:
    """`sco reclaim` of the node's instance (the operator's certificate); the notice its
    hall's relay pod signs and the drain report its agent publishes, both heard with the
    box's own identity."""
    nc = await nats.connect(r.control.nats_url, connect_timeout=5, **nats_options(r.control))
    try:
        loop = asyncio.get_running_loop()
        report: asyncio.Future[dict[str, Any]] = loop.create_future()
        notice: asyncio.Future[dict[str, Any]] = loop.create_future()

        async def on_report(msg: Msg) -> None:
            event = json.loads(msg.data)
            if event.get("event") == "drain_finished" and not report.done():
                report.set_result(event)

        async def on_notice(msg: Msg) -> None:
            if not notice.done():
                notice.set_result(json.loads(msg.data))

        await nc.subscribe(drain_subject("r1", node.hall, node.name), cb=on_report)
        await nc.subscribe(f"sco.r1.notice.{node.hall}.{node.name}", cb=on_notice)
        await nc.flush()
        out = await asyncio.to_thread(
            _sco,
            operator_env(r.operator_file),
            "reclaim",
            node.name,
            "--region",
            "r1",
            "--by",
            "test",
        )
        try:
            return Reclaimed(
                await asyncio.wait_for(notice, 60), await asyncio.wait_for(report, 120)
            )
        except TimeoutError:
            raise AssertionError(
                f"no notice or drain report\n{out}\n{node.logs()}\n{logs(deployments)}"
            ) from None
    finally:
        await nc.close()


def test_the_region_as_shipped_drains_resumes_and_revokes(
    region: Region,
    image: str,  # noqa: F811 -- the fixture imported above
    node_image: str,
    deb: Path,
    rgw: RgwCluster,
    region_r1: RegionCatalogue,
    tmp_path: Path,
) -> None:
    r = region
    t0 = time.monotonic()

    def phase(name: str) -> None:  # shown with -s, and with a failure's captured output
        print(f"{time.monotonic() - t0:6.1f} s  {name}", flush=True)

    # The example contracts signed with a key of the test's, each hall's relay its own notice
    # key; published where the worker's init container and the agents fetch it.
    bundle = signed_bundle(tmp_path)
    asyncio.run(publish(r.control.nats_url, "r1", bundle.raw, nats_options(r.control)))
    with (
        SimulatedCloudThread(region_r1, r.control),
        played_region(r, image, bundle, tmp_path) as deployments,
    ):
        phase("overlay r1's Jobs done and every pod healthy, over TLS")
        _the_region_at_work(r, deployments, bundle, node_image, deb, rgw, tmp_path, phase)


def _the_region_at_work(
    r: Region,
    deployments: list[Doc],
    bundle: SignedBundle,
    node_image: str,
    deb: Path,
    rgw: RgwCluster,
    tmp_path: Path,
    phase: Callable[[str], None],
) -> None:
    instances = _demand(r, deployments)
    first, second = sorted(instances)[:2]
    phase(f"{len(instances)} {DEMAND_CONTRACT} instances active (the pods' controller, on demand)")

    on_rgw = _rgw_store(r, rgw, tmp_path)
    phase("llm-train's checkpoint keys on RGW, kept in OpenBao")
    # Job 1 checkpoints to RGW; job 2 to a shared directory. Both write their status here.
    store = Path(tempfile.mkdtemp(prefix="sco-region-ckpt-"))
    os.chmod(store, 0o777)  # both tenants write their job's directory in it
    nodes: list[Node] = []
    try:
        nodes = [
            _start_node(r, name, instances[name], deb, node_image, tmp_path, store, bundle.pub)
            for name in (first, second)
        ]
        node1, node2 = nodes
        for n in nodes:
            _agent_ready(n)
        phase("both agents ready")
        # Each node's own job, each as its own tenant (neither is the agent's user).
        job1 = _run_job(node1, "job-1", "tenant1", on_rgw)
        job2 = _run_job(node2, "job-2", "tenant2")

        def training() -> bool:
            return all(int(_status(store, j).get("step", 0)) >= 25 for j in (job1, job2))

        eventually(training, timeout=60, what="both jobs training", every=0.2, retrying=())
        assert _status(store, job1)["uid"] == TENANTS["tenant1"]
        assert _status(store, job2)["uid"] == TENANTS["tenant2"]

        reclaimed = asyncio.run(_reclaim_and_report(r, node1, deployments))
        phase("node 1 drained")
        # Signed by node 1's hall's relay pod with that hall's own key.
        assert reclaimed.notice["key_id"] == bundle.notice_keys[node1.hall][0], reclaimed.notice
        report = reclaimed.report
        assert not report["conservative"] and not report["error"], report
        # Scheduler-less nodes match no contract (no Slurm comment, no pod label): the
        # default action, requeue, asks the job to checkpoint first, and it answered.
        [outcome] = report["workloads"]
        assert outcome["workload"] == "job-1" and outcome["result"] == "requeued", report
        saved = int(_status(store, job1)["saved"])
        run = on_rgw.job_dir("job-1")
        assert outcome["path"] == f"s3://checkpoints/llm-train/{run}/step-{saved}", report
        listed = json.loads(
            _sco(r.env, "checkpoints", "list", "llm-train", "--json",
                 "--credentials", str(tmp_path / "checkpoint-keys"))
        )  # fmt: skip
        assert {(x["step"], x["state"]) for x in listed if x["run"] == run} == {
            (saved, "complete")
        }, listed

        # The job resumes on node 2 from node 1's checkpoint on RGW, at the step it saved.
        resumed = _run_job(node2, "job-1", "tenant1", on_rgw)
        eventually(
            lambda: _status(store, resumed).get("listening") is True,
            timeout=60, what="job-1 running on node 2", every=0.2, retrying=(),
        )  # fmt: skip
        assert _status(store, resumed)["resumed_from"] == saved
        assert int(_status(store, resumed)["step"]) >= saved

        phase("job resumed on node 2")

        # The controller replaces the reclaimed instance: demand is unchanged.
        try:
            eventually(
                lambda: set(_ci_runners(r)) - set(instances),
                timeout=240, what="the replacement instance active", every=1, retrying=(),
            )  # fmt: skip
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}\n{logs(deployments)}") from exc
        phase("replacement active")

        # Node 1's identity revoked: the box's NATS refuses its certificate from the reload
        # on, node 2's still subscribes to its notices.
        asyncio.run(_subscribes(r, node1))
        out = _sco(r.env, "dev", "certs", "revoke", node1.cert["identity"], "--reason", "reclaimed")
        assert "reloaded" in out, out
        with pytest.raises(Exception) as refused:  # nats-py raises several unrelated types
            asyncio.run(_subscribes(r, node1))
        assert "authorization" in repr(refused.value).lower() or isinstance(
            refused.value, (OSError, nats.errors.Error)
        ), repr(refused.value)
        asyncio.run(_subscribes(r, node2))
        # Node 1's agent itself was cut off by the reload, and its reconnects are refused.
        eventually(
            lambda: "authorization violation" in node1.logs().lower(),
            timeout=30, what="node 1's agent refused", every=0.5, retrying=(),
        )  # fmt: skip
        phase("node 1 revoked")
        listed = json.loads(_sco(r.env, "dev", "certs", "list", "--json"))
        assert [x["identity"] for x in listed["revoked"]] == [node1.cert["identity"]]
    finally:
        for n in nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                podman("rm", "-f", "-t", "3", n.container, timeout=60)
        shutil.rmtree(store, ignore_errors=True)


def test_the_box_server_certificate_names_the_pods_address(region: Region) -> None:
    """verify-full as a pod does it: libpq checks the box's PostgreSQL certificate against
    10.0.2.2 (hostaddr reaches the box's loopback; host is the name verified)."""
    info = psycopg.conninfo.conninfo_to_dict(postgres_conninfo(region.control))
    info.update(host=POD_HOST, hostaddr="127.0.0.1")
    with psycopg.connect(**info) as conn:  # type: ignore[arg-type]
        assert conn.execute("SELECT 1").fetchone() == (1,)
