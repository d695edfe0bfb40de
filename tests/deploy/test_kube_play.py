"""Overlay r1, run: its Jobs and Deployments under `podman kube play`, from the rendered
spec, against the box's real services (PostgreSQL, NATS, Temporal's dev server, Kafka
(tansu), the simulated cloud). The database migration and the Temporal bootstrap Jobs
complete; every pod's health endpoint answers; the worker completes an acquisition; a
notice relay publishes a notice; the ledger consumer writes a row. What the rendering is
changed by (tests/support/kube_play.py) is listed in tests/deploy/README.md."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nats
import pytest
import yaml

from activities.events import CapacityType, InstanceState
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository
from activities.provider.sim_service import serve
from activities.provider.simulator import SimulatedCloud
from contracts import keys
from contracts.compiler import compile_and_sign
from contracts.distribution import publish
from contracts.notice_scopes import add_key
from contracts.region import Region
from tests.deploy.test_k8s_manifests import TLS_KINDS, render
from tests.support import services
from tests.support.image import current_image
from tests.support.kube_play import Doc, Played, PlayInputs, for_podman
from tests.support.nats_sync import server_has_seen
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO
from tests.support.wait import WaitTimeout, eventually, eventually_async
from workers.devbox.services import KafkaService
from workers.settings import Settings, WorkerSettings

if TYPE_CHECKING:
    from temporalio.client import Client

pytestmark = pytest.mark.tools("podman", "runc", "debootstrap", "slirp4netns")

BUILD = WorkerSettings().effective_build_id()
IMAGE = f"registry.sco.internal/sco/sco:{BUILD}"
CONF = REPO / "deploy" / "image" / "containers.conf"
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": str(CONF)}
# Each pod its own network namespace (so every pod keeps its rendered ports), with the
# host's loopback reachable as 10.0.2.2 (PostgreSQL listens on 127.0.0.1 only).
NETWORK = "slirp4netns:allow_host_loopback=true"
HOST_LOOPBACK = "10.0.2.2"
LEDGER_MOUNT = "/var/lib/sco-ledger"


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    out = subprocess.run(
        ["podman", *args], env=PODMAN_ENV, capture_output=True, text=True, timeout=timeout
    )
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {out.stderr[-2000:]}")
    return out.stdout


def until_or_logs(
    what: str, probe: Callable[[], bool], timeout: float, diag: Callable[[], str]
) -> None:
    """`eventually` whose failure carries `diag()` (the pods' logs)."""
    try:
        eventually(probe, timeout=timeout, what=what, every=1.0, retrying=())
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}\n{diag()}") from exc


# -- the images ---------------------------------------------------------------------------

#: No ClickHouse server runs on the box: the ledger is the embedded chDB (the region in a
#: box's) in a host directory shared by the pods, so the image gets chdb on top.
LEDGER_LAYER = """\
ARG IMAGE
FROM ${IMAGE}
USER 0
RUN --mount=type=secret,id=ca ca=/run/secrets/ca; \\
    [ -s "$ca" ] || ca=/etc/ssl/certs/ca-certificates.crt; \\
    PIP_CERT="$ca" /opt/sco/bin/pip install --quiet "chdb==${CHDB}" "chdb-core==${CHDB_CORE}"
USER 10001:10001
"""


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """This tree's image (`make image`, once per session), then the ledger layer."""
    current_image()
    chdb = importlib.metadata.version("chdb")
    # Tagged by the built image's id: a rebuilt image gets a layer of its own.
    base_id = podman("image", "inspect", "--format", "{{.Id}}", IMAGE).strip()[:12]
    tag = f"localhost/sco-kube-play:{base_id}-chdb{chdb}"
    if subprocess.run(["podman", "image", "exists", tag], env=PODMAN_ENV).returncode != 0:
        ctx = tmp_path_factory.mktemp("ledger-layer")
        core = importlib.metadata.version("chdb-core")
        layer = LEDGER_LAYER.replace("${CHDB}", chdb).replace("${CHDB_CORE}", core)
        (ctx / "Containerfile").write_text(layer)
        podman(
            "build",
            "--network",
            "host",
            "--build-arg",
            f"IMAGE={IMAGE}",
            "--secret",
            "id=ca,src=/etc/ssl/certs/ca-certificates.crt",
            "-t",
            tag,
            str(ctx),
            timeout=900,
        )
    return tag


# -- the box's services -------------------------------------------------------------------


def _host_address() -> str:
    """The host's own address (not loopback): a pod reaches it through slirp, and so does
    the host, which matters for Kafka's advertised listener."""
    out = subprocess.run(
        ["ip", "-4", "-o", "route", "get", "192.0.2.254"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[out.index("src") + 1]


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _wait_port(host: str, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    import socket

    def listening() -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex((host, port)) == 0:
                return True
        assert proc.poll() is None, log.read_text()[-2000:]
        return False

    until_or_logs(
        f"{argv0(proc)} listening on {port}", listening, 90, lambda: log.read_text()[-2000:]
    )


def argv0(proc: subprocess.Popen[bytes]) -> str:
    return str(proc.args[0] if isinstance(proc.args, list) else proc.args)


class Box:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        self.nats_port = services.free_port()
        self.temporal_port = services.free_port()
        self.kafka = f"{_host_address()}:{services.free_port()}"
        self.dsn = services.scratch_database(BASE_DSN)
        self.sim_prefix = f"kp{uuid.uuid4().hex[:8]}"
        bin_dir = Path(sys.executable).parent
        nats_log = root / "nats.log"
        self.procs.append(
            _start(
                [
                    str(bin_dir / "nats-server"),
                    "-a",
                    "127.0.0.1",
                    "-p",
                    str(self.nats_port),
                    "-js",
                    "-sd",
                    str(root / "nats"),
                ],
                nats_log,
            )
        )
        _wait_port("127.0.0.1", self.nats_port, self.procs[-1], nats_log)
        temporal_log = root / "temporal.log"
        self.procs.append(
            _start(
                [
                    str(bin_dir / "temporal"),
                    "server",
                    "start-dev",
                    "--ip",
                    "127.0.0.1",
                    "--port",
                    str(self.temporal_port),
                    "--headless",
                    "--log-level",
                    "warn",
                ],
                temporal_log,
            )
        )
        _wait_port("127.0.0.1", self.temporal_port, self.procs[-1], temporal_log)
        kafka = KafkaService(
            Settings(
                data_dir=root / "kafka", kafka={"bootstrap_servers": self.kafka}, regions=["r1"]
            )
        )
        self.kafka_record = kafka.start()
        kafka.prepare()  # the estate's topics, as its Kafka is provisioned

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    def pod_env(self) -> dict[str, str]:
        """The box's services as the pods reach them (sco-region ConfigMap additions)."""
        return {
            "SCO_NATS_URL": f"nats://{HOST_LOOPBACK}:{self.nats_port}",
            "SCO_TEMPORAL__ADDRESS": f"{HOST_LOOPBACK}:{self.temporal_port}",
            "SCO_KAFKA__BOOTSTRAP_SERVERS": self.kafka,
            "SCO_KAFKA__REPLICATION_FACTOR": "1",
            # The simulated cloud stands in for the region's OpenStack.
            "SCO_PROVIDER__KIND": "simulator",
            "SCO_PROVIDER__SIMULATOR_PREFIX": self.sim_prefix,
        }

    def host_env(self, cache: Path, trust: Path) -> dict[str, str]:
        """`sco` on the host, as an operator reaches the same region."""
        return {
            **os.environ,
            "SCO_CONFIG": str(self.root / "operator.toml"),
            "SCO_REGION": "r1",
            "SCO_REGIONS_DIR": str(REGIONS_DIR),
            "SCO_DATA_DIR": str(self.root / "operator"),
            "SCO_POSTGRES_DSN": self.dsn,
            "SCO_NATS_URL": self.nats_url,
            "SCO_TEMPORAL__ADDRESS": f"127.0.0.1:{self.temporal_port}",
            "SCO_KAFKA__BOOTSTRAP_SERVERS": self.kafka,
            # The operator's own audit records; the pods' ledger is read from inside a
            # pod (files made by root here would be unwritable for the pods' uid).
            "SCO_LEDGER_DSN": f"chdb://{self.root / 'operator-ledger'}",
            "SCO_CONTRACTS__CACHE_DIR": str(cache),
            "SCO_CONTRACTS__TRUST_DIR": str(trust),
            "SCO_PROVIDER__SIMULATOR_PREFIX": self.sim_prefix,
        }

    def close(self) -> None:
        from workers.devbox import process

        process.stop(self.kafka_record)
        for proc in self.procs:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        services.drop_database(self.dsn)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    b = Box(tmp_path_factory.mktemp("box"))
    yield b
    b.close()


@pytest.fixture
async def simulated_cloud(box: Box, region_r1: Region) -> AsyncIterator[None]:
    cloud = SimulatedCloud(region_r1, clock=asyncio.get_running_loop().time)
    nc = await nats.connect(box.nats_url)
    task = asyncio.create_task(serve(cloud, nc, prefix=box.sim_prefix))
    yield
    task.cancel()
    await nc.close()


# -- the region's inputs: the documented Secrets and the published bundle -----------------


@dataclass(frozen=True)
class SignedBundle:
    raw: bytes  # the region's bundle, signed
    trust: Path  # the trust directory holding its signing key's .pub
    pub: Path
    notice_keys: dict[str, tuple[str, Path]]  # hall -> (key id, private key file)


def signed_bundle(root: Path) -> SignedBundle:
    """The example contracts compiled and signed with a fresh key, each hall's relay its own
    notice key, scoped to its hall in the bundle."""
    signing = root / "signing"
    _, key_path, _ = keys.generate(signing)
    trust = root / "trust"
    trust.mkdir()
    pub = next(signing.glob("*.pub"))
    shutil.copy(pub, trust / pub.name)
    notice_keys = root / "notice-keys"
    notice_secrets = {}
    for hall in "ABCD":  # each hall's relay its own key, scoped to its hall in the bundle
        kid, key, _ = keys.generate(notice_keys / "r1")
        notice_secrets[hall] = (kid, key)
        add_key(notice_keys / "r1", kid, [hall])
    out = root / "bundle.json"
    result, serial = compile_and_sign(
        REPO / "contracts" / "examples",
        REGIONS_DIR,
        keys.load_signing_key(key_path),
        out,
        serial=None,
        created_at=datetime.now(UTC),
        notice_keys_dir=notice_keys,
    )
    assert serial is not None, result.findings
    return SignedBundle(out.read_bytes(), trust, pub, notice_secrets)


def notice_key_secrets(bundle: SignedBundle) -> dict[str, dict[str, str]]:
    return {
        f"sco-notice-key-{hall.lower()}": {"notice.key": key.read_text()}
        for hall, (_, key) in bundle.notice_keys.items()
    }


def region_inputs(root: Path, box: Box, image: str) -> tuple[PlayInputs, bytes, Path]:
    """The overlay's documented inputs (deploy/k8s/examples/secrets.example.yaml's names and
    keys) with this box's values; the signed bundle; the trust directory."""
    bundle = signed_bundle(root)
    pub = bundle.pub
    ledger = root / "ledger"
    ledger.mkdir(mode=0o777)
    os.chmod(ledger, 0o777)  # the pods run as 10001
    pg = box.dsn.replace("127.0.0.1", HOST_LOOPBACK)
    inputs = PlayInputs(
        image=image,
        secrets={
            # The box's services are plaintext and password-less (plaintext=True below).
            "sco-credentials": {
                "postgres.password": "unused",
                "ledger.password": "unused",
                "kafka.password": "unused",
            },
            **{
                f"sco-tls-{kind}": {"tls.crt": "unused", "tls.key": "unused", "ca.crt": "unused"}
                for kind in TLS_KINDS
            },
            "sco-nats-control": {"password": "unused"},
            **{f"sco-nats-relay-{h}": {"password": "unused"} for h in "abcd"},
            "sco-clouds": {"clouds.yaml": "clouds: {}\n"},  # unused: the simulated cloud
            "sco-contract-trust": {pub.name: pub.read_text()},
            **notice_key_secrets(bundle),
            "sco-slurmrestd": {"token": "unused-slurm-intake-is-off"},
            "sco-workload-kubeconfig": {"kubeconfig": "apiVersion: v1\nkind: Config\n"},
        },
        secret_dir=root / "secrets",
        env={
            **box.pod_env(),
            "SCO_POSTGRES_DSN": pg,
            "SCO_LEDGER_DSN": f"chdb://{LEDGER_MOUNT}/ledger",
        },
        shared={LEDGER_MOUNT: ledger},
        plaintext=True,
    )
    return inputs, bundle.raw, bundle.trust


def write_secret_files(played: Played) -> None:
    for path, text in played.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chown(path.parent, 10001, 10001)
        path.write_text(text)
        os.chown(path, 10001, 10001)
        # libpq refuses a key its owner's group or others may read (a Secret volume's
        # files are root's, 0440, which it accepts).
        os.chmod(path, 0o600 if path.name.endswith(".key") else 0o644)


# -- the pods -----------------------------------------------------------------------------


def pod_name(doc: Doc, replica: int = 0) -> str:
    """kube play names a Deployment's pods <name>-pod-<i>, a Pod by its name."""
    name = str(doc["metadata"]["name"])
    return f"{name}-pod-{replica}" if doc["kind"] == "Deployment" else name


def pod_names(doc: Doc) -> list[str]:
    """Every pod of the document: kube play 4.3.1 runs each replica of a Deployment."""
    replicas = int(doc["spec"].get("replicas", 1)) if doc["kind"] == "Deployment" else 1
    return [pod_name(doc, i) for i in range(replicas)]


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"]
    return spec


def logs(docs: list[Doc]) -> str:
    out = []
    for doc in docs:
        spec = pod_spec(doc)
        for c in spec["containers"]:
            ctr = f"{pod_name(doc)}-{c['name']}"
            text = podman("logs", "--tail", "25", ctr, check=False, timeout=30)
            state = podman(
                "inspect",
                "--format",
                "{{.State.Status}} {{.State.ExitCode}}",
                ctr,
                check=False,
                timeout=30,
            )
            out.append(f"--- {ctr} ({state.strip()})\n{text}")
    return "\n".join(out)


def exit_code(ctr: str) -> int | None:
    state = podman(
        "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", ctr, check=False, timeout=30
    ).split()
    if len(state) != 2 or state[0] not in ("exited", "stopped"):
        return None
    return int(state[1])


def probe_answers(ctr: str, container: Doc) -> str | None:
    """The container's readiness probe (else liveness), from inside its pod's network: None
    when it answers 200, else what it answered (status and body, or the error)."""
    probe = container.get("readinessProbe") or container["livenessProbe"]
    port = probe["httpGet"]["port"]  # a number: for_podman resolved the named port
    code = (
        "import urllib.request,urllib.error,sys\n"
        "try:\n"
        f" r=urllib.request.urlopen('http://127.0.0.1:{port}{probe['httpGet']['path']}',"
        " timeout=3); print(r.status, r.read(300).decode(errors='replace'))\n"
        "except urllib.error.HTTPError as e: print(e.code, e.read(300).decode(errors='replace'))\n"
        "except Exception as e: print(type(e).__name__, e)\n"
    )
    try:
        run = subprocess.run(
            ["podman", "exec", ctr, "python3", "-c", code],
            env=PODMAN_ENV,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        return "podman exec took over 30 s"
    answer = (run.stdout.strip() or run.stderr.strip()[-300:]).replace("\n", " ")
    return None if answer.startswith("200 ") else answer or f"exit {run.returncode}"


def exited(ctr: str) -> bool:
    return exit_code(ctr) is not None


#: Init containers as Kubernetes runs them, on every pod start, and kept afterwards: podman's
#: default ("once") removes them after their run, which 4.3.1 with runc gets wrong (below).
INIT_ALWAYS = ["--annotation", "io.podman.annotations.init.container.type=always"]
#: podman 4.3.1 with runc, on a loaded machine, sometimes removes a finished init container
#: before its state says so and gives up on the pod; playing the pod again gets past it.
INIT_RACE = "failed to remove once init container"


def play(docs: list[Doc], path: Path) -> None:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    attempts = 4
    for attempt in range(attempts):
        run = subprocess.run(
            ["podman", "kube", "play", "--network", NETWORK, *INIT_ALWAYS, str(path)],
            env=PODMAN_ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if run.returncode == 0:
            return
        if INIT_RACE not in run.stderr or attempt == attempts - 1:
            raise AssertionError(f"podman kube play {path.name}: {run.stderr[-2000:]}")
        podman("kube", "down", str(path), check=False, timeout=120)
        for doc in docs:
            if doc["kind"] != "ConfigMap":
                for pod in pod_names(doc):
                    podman("pod", "rm", "-f", pod, check=False, timeout=120)


def teardown(files: list[Path], pods: list[str], volumes: list[str]) -> None:
    for f in files:
        podman("kube", "down", str(f), check=False, timeout=120)
    for pod in pods:  # what a failed play left behind
        podman("pod", "rm", "-f", pod, check=False, timeout=120)
    for name in volumes:
        podman("volume", "rm", "-f", name, check=False, timeout=60)


def played_parts(played: Played) -> tuple[list[Doc], list[Doc], list[Doc]]:
    """The rendered overlay's ConfigMaps, its two Jobs (as Pods) and its Deployments."""
    configmaps = [d for d in played.docs if d["kind"] == "ConfigMap"]
    jobs = [d for d in played.docs if d["kind"] == "Pod"]
    deployments = [d for d in played.docs if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"].rsplit("-", 1)[0] for d in jobs} == {
        "sco-db-migrate",
        "sco-temporal-bootstrap",
    }
    return configmaps, jobs, deployments


async def sco(env: dict[str, str], *args: str) -> tuple[int, str]:
    return await services.run_sco(env, *args, cwd=REPO)


async def play_region(
    jobs: list[Doc], deployments: list[Doc], configmaps: list[Doc], root: Path, played: list[Path]
) -> None:
    """The Jobs, migration first (a new build's schema before its pods), each to exit 0;
    then every Deployment, until each pod's health endpoint answers. `played` gets each
    played file, for `teardown`."""
    for job in sorted(jobs, key=lambda d: not d["metadata"]["name"].startswith("sco-db-")):
        path = root / f"{job['metadata']['name']}.yaml"
        played.append(path)
        await asyncio.to_thread(play, [*configmaps, job], path)
        ctr = f"{pod_name(job)}-{pod_spec(job)['containers'][0]['name']}"
        await asyncio.to_thread(
            until_or_logs,
            f"Job {ctr} exits",
            functools.partial(exited, ctr),
            300,
            functools.partial(logs, [job]),
        )
        assert exit_code(ctr) == 0, logs([job])

    for doc in deployments:
        path = root / f"{doc['metadata']['name']}.yaml"
        played.append(path)
        await asyncio.to_thread(play, [*configmaps, doc], path)

    # Which containers are not ready yet and what their probes answered: a timeout names
    # them (the processes' logs alone did not say which).
    waiting: dict[str, str] = {}

    def all_ready() -> bool:
        waiting.clear()
        for doc in deployments:
            for pod in pod_names(doc):
                for c in pod_spec(doc)["containers"]:
                    if "readinessProbe" not in c and "livenessProbe" not in c:
                        continue
                    ctr = f"{pod}-{c['name']}"
                    if (answer := probe_answers(ctr, c)) is not None:
                        waiting[ctr] = answer
        return not waiting

    def diag() -> str:
        not_ready = "\n".join(f"  {ctr}: {answer}" for ctr, answer in sorted(waiting.items()))
        return f"not ready:\n{not_ready}\n{logs(deployments)}"

    await asyncio.to_thread(until_or_logs, "every pod's health endpoint", all_ready, 420, diag)


# -- the test -----------------------------------------------------------------------------


@pytest.mark.tools("kubectl")
@pytest.mark.timeout(1500)
async def test_overlay_r1_runs_under_podman_kube_play(
    image: str, box: Box, simulated_cloud: None, tmp_path: Path
) -> None:
    inputs, raw_bundle, trust = region_inputs(tmp_path, box, image)
    played = for_podman(list(render("r1")), inputs)
    write_secret_files(played)
    configmaps, jobs, deployments = played_parts(played)
    # The contract distributor has the region's bundle before the worker's init container.
    await publish(box.nats_url, "r1", raw_bundle)
    played_files: list[Path] = []
    try:
        await play_region(jobs, deployments, configmaps, tmp_path, played_files)
        await _acquisition_notice_and_ledger(box, tmp_path, trust, deployments)
    finally:
        await asyncio.to_thread(
            teardown,
            list(reversed(played_files)),
            [pod for d in [*jobs, *deployments] for pod in pod_names(d)],
            [d["metadata"]["name"] for d in configmaps] + played.volumes,
        )


async def make_build_current(client: Client, deployments: list[Doc]) -> None:
    """deploy/README.md step 6: the first build becomes current (versioning is on)."""
    from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest

    async def made_current() -> bool:
        await client.workflow_service.set_worker_deployment_current_version(
            SetWorkerDeploymentCurrentVersionRequest(
                namespace="r1", deployment_name="sco-r1", build_id=BUILD, identity="test"
            )
        )
        return True

    try:  # the version registers with the worker's first poll; until then the call fails
        await eventually_async(
            made_current, timeout=180, what=f"build {BUILD} made current", every=2
        )
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}\n{logs(deployments)}") from exc


async def _acquisition_notice_and_ledger(
    box: Box, root: Path, trust: Path, deployments: list[Doc]
) -> None:
    from temporalio.client import Client

    (box.root / "operator.toml").write_text("")
    cache = root / "operator-cache"
    env = box.host_env(cache, trust)
    code, out = await sco(env, "contracts", "pull", "--name", "operator")
    assert code == 0, out
    client = await Client.connect(f"127.0.0.1:{box.temporal_port}", namespace="r1")
    await make_build_current(client, deployments)

    code, out = await sco(env, "pools", "sync", "--region", "r1")
    assert code == 0, out + logs(deployments)
    code, out = await sco(env, "demand", "set", "ci-runners", "8", "--region", "r1")
    assert code == 0, out
    rows: list[dict[str, Any]] = []

    async def acquired() -> bool:
        nonlocal rows
        code, out = await sco(
            env,
            "acquisitions",
            "list",
            "--all",
            "--region",
            "r1",
            "--contract",
            "ci-runners",
            "--json",
        )
        rows = json.loads(out) if code == 0 else []
        return any(r["state"] == "completed" and int(r["acquired"]) >= 1 for r in rows)

    with contextlib.suppress(WaitTimeout):  # the assertion below says what was there
        await eventually_async(
            acquired, timeout=300, what="a completed ci-runners acquisition", every=3, retrying=()
        )
    assert any(r["state"] == "completed" and int(r["acquired"]) >= 1 for r in rows), (
        f"{rows}\n{logs(deployments)}"
    )

    # A notice relay publishes a notice: an operator reclaims one of the instances.
    pool = open_pool(box.dsn, max_size=1)
    try:
        live = [  # a floor's committed instances are not reclaimed without --force
            i
            for i in FleetRepository(pool).list_instances("r1", [InstanceState.ACTIVE])
            if i.capacity_type is not CapacityType.COMMITTED
        ]
    finally:
        pool.close()
    assert live, "the acquisition left no active instance"
    nc = await nats.connect(box.nats_url)
    got: list[bytes] = []
    noticed = asyncio.Event()

    async def heard(msg: Any) -> None:
        got.append(msg.data)
        noticed.set()

    try:
        await nc.subscribe("sco.r1.notice.>", cb=heard)
        await server_has_seen(nc)
        code, out = await sco(env, "reclaim", live[0].instance_id, "--region", "r1", "--by", "test")
        assert code == 0, out + logs(deployments)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(noticed.wait(), 60)
        assert got, logs(deployments)
    finally:
        await nc.close()

    # The ledger consumer writes the acquisition's lifecycle events (outbox -> Kafka -> ledger).
    consumer = next(d for d in deployments if d["metadata"]["name"] == "sco-ledger-consumer")
    ctr = f"{pod_name(consumer)}-{pod_spec(consumer)['containers'][0]['name']}"
    count_rows = (
        "from activities.ledger.store import LedgerStore\n"
        f"with LedgerStore('chdb://{LEDGER_MOUNT}/ledger') as s, s.session() as ch:\n"
        "    print(ch.query('SELECT count() FROM lifecycle_events FINAL').result_rows[0][0])\n"
    )

    def events() -> int:
        out = podman("exec", ctr, "python3", "-c", count_rows, timeout=120, check=False)
        return int(out.strip().splitlines()[-1]) if out.strip() else 0

    count = 0
    with contextlib.suppress(WaitTimeout):  # the assertion below carries the logs
        # An error is "not yet": the table appears with the consumer's first batch.
        count = await eventually_async(
            lambda: asyncio.to_thread(events), timeout=180, what="ledger rows", every=3
        )
    assert count >= 1, logs(deployments)
