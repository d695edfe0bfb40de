"""Overlay r1 with TLS on, under `podman kube play`, against the secure box (issue 30).

The secure region in a box (`sco dev up --profile secure`, without its own workers): TLS-only
PostgreSQL (client certificate and password file), NATS mapping each certificate's SPIFFE ID
to its role's user (`verify_and_map`), Temporal behind nginx's mutual TLS. The overlay is
rendered as shipped, TLS on for those three (sco.toml's `nats_tls`, `postgres`,
`temporal.tls`); the box's Kafka (tansu 0.6, no TLS) and the ledger (embedded chDB, no
server) are the only plaintext ones (`PlayInputs.plaintext_services`). Every Deployment and
Job mounts its own kind's certificate Secret, `sco-tls-<kind>`, here made from the box's CA
issuing that kind's identity (`spiffe://sco/r1/<kind>`, a hall's relay
`spiffe://sco/r1/notice-relay/<hall>`); the pods reach the box at 10.0.2.2 (slirp4netns),
which the box's server certificates name (verify-full).

Shown: the migration and bootstrap Jobs complete over TLS PostgreSQL and mutual-TLS
Temporal, each with its own kind's certificate; every Deployment's health endpoint answers;
the pods' worker runs an acquisition over mutual-TLS Temporal; hall A's relay pod signs a
reclaim notice with hall A's key over mTLS NATS as its hall's identity; the box's server
certificates verify for the pods' address.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import psycopg
import pytest
from nats.aio.msg import Msg

from activities.events import InstanceState
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository
from activities.provider.sim_service import serve
from activities.provider.simulator import SimulatedCloud
from contracts.distribution import publish
from contracts.region import Region
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
    pod_names,
    signed_bundle,
    teardown,
    write_secret_files,
)
from tests.support import services
from tests.support.kube_play import Doc, PlayInputs, for_podman
from tests.support.paths import REGIONS_DIR, REPO
from workers.client_security import nats_options, postgres_conninfo
from workers.devbox import tls_servers
from workers.devbox.box import Box
from workers.devbox.secure import BOX_KIND, POD_HOST, SecureProfile
from workers.settings import Settings
from workers.temporal_connect import connect
from workflows.acquisition.models import AcquisitionInput, AcquisitionState, LaunchItem
from workflows.acquisition.workflow import AcquisitionWorkflow

pytestmark = [
    pytest.mark.devbox,
    pytest.mark.tools("podman", "runc", "slirp4netns", "nginx", "kubectl"),
    pytest.mark.timeout(900),
]


def spiffe_kind(secret_kind: str) -> str:
    """The identity kind a `sco-tls-<kind>` Secret holds: a hall's relay `notice-relay/<H>`."""
    if secret_kind.startswith("notice-relay-"):
        return f"notice-relay/{secret_kind.rsplit('-', 1)[1].upper()}"
    return secret_kind


@dataclass(frozen=True)
class SecureBox:
    profile: SecureProfile
    control: Settings  # the box's own identity (control-r1's NATS permissions)
    operator_env: dict[str, str]  # `sco` as the operator (its own certificate)
    kafka: str  # host address:port (plaintext): pods and host reach it alike
    database: str


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SCO_")}


@pytest.fixture(scope="module")
def secure_box() -> Iterator[SecureBox]:
    if tls_servers.postgres_bin_dir() is None:
        pytest.skip("PostgreSQL server binaries missing: apt-get install -y postgresql")
    # Outside pytest's tmp tree (private to root): PostgreSQL runs as the postgres user.
    tmp = Path(tempfile.mkdtemp(prefix="sco-kp-secure-"))
    database = f"kps_{uuid.uuid4().hex[:8]}"
    kafka = f"{_host_address()}:{services.free_port()}"
    env = {
        "SCO_DATA_DIR": str(tmp / "sco"),
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_POSTGRES_DSN": f"postgresql://postgres@127.0.0.1:5432/{database}",
        "SCO_BOX__SECURE_POSTGRES_PORT": str(services.free_port()),
        "SCO_BOX__SECURE_NATS_PORT": str(services.free_port()),
        "SCO_BOX__SECURE_TEMPORAL_PORT": str(services.free_port()),
        "SCO_BOX__SECURE_TEMPORAL_BACKEND_PORT": str(services.free_port()),
        "SCO_KAFKA__BOOTSTRAP_SERVERS": kafka,
    }
    before = dict(os.environ)
    os.environ.update(env)
    try:
        box = Box(Settings(), profile="secure")  # no workers: the pods are the region
        box.up()
        assert box.secure is not None
        operator_file = box.operator_settings_files()["r1"]
        control = box.secure.settings_for(BOX_KIND, "r1")
        yield SecureBox(
            box.secure,
            control,
            {**_plain_env(), "SCO_CONFIG": operator_file},
            kafka,
            database,
        )
    finally:
        try:
            Box(Settings()).down()
        finally:
            os.environ.clear()
            os.environ.update(before)
        shutil.rmtree(tmp, ignore_errors=True)


def secure_inputs(
    root: Path, box: SecureBox, tag: str, secrets: dict[str, dict[str, str]]
) -> PlayInputs:
    """The documented Secrets with the secure box's values: each kind's certificate from the
    box's CA, PostgreSQL's password; NATS users come from the certificates (the password
    files are mounted but the box's `verify_and_map` ignores them)."""
    p = box.profile
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
                "kafka.password": "unused-the-box-kafka-is-plaintext",
            },
            **tls,
            "sco-nats-control": {"password": "unused-the-user-is-the-certificate"},
            **{f"sco-nats-relay-{h}": {"password": "unused"} for h in "abcd"},
            "sco-clouds": {"clouds.yaml": "clouds: {}\n"},  # unused: the simulated cloud
            "sco-slurmrestd": {"token": "unused-slurm-intake-is-off"},
            "sco-workload-kubeconfig": {"kubeconfig": "apiVersion: v1\nkind: Config\n"},
            **secrets,
        },
        secret_dir=root / "secrets",
        env={
            "SCO_NATS_URL": f"tls://{POD_HOST}:{p.nats_port}",
            "SCO_TEMPORAL__ADDRESS": f"{POD_HOST}:{p.temporal_port}",
            "SCO_POSTGRES_DSN": f"postgresql://postgres@{POD_HOST}:{p.postgres_port}/{box.database}",
            "SCO_KAFKA__BOOTSTRAP_SERVERS": box.kafka,
            "SCO_KAFKA__REPLICATION_FACTOR": "1",
            "SCO_LEDGER_DSN": f"chdb://{LEDGER_MOUNT}/ledger",
            # The simulated cloud stands in for the region's OpenStack.
            "SCO_PROVIDER__KIND": "simulator",
        },
        shared={LEDGER_MOUNT: ledger},
        # The box's NATS user is the certificate's: no password is sent (it would refuse it).
        plaintext_services=frozenset({"kafka", "ledger", "nats_password"}),
    )


@pytest.mark.timeout(900)
async def test_overlay_r1_runs_over_tls_against_the_secure_box(
    image: str,  # noqa: F811 -- the fixture imported above
    secure_box: SecureBox,
    region_r1: Region,
    tmp_path: Path,
) -> None:
    """The migration Job over TLS PostgreSQL (its own client certificate, verify-full of
    10.0.2.2, the password from its file), the bootstrap Job over mutual-TLS Temporal; each
    exits 0. Then every Deployment, each with its own kind's certificate, until each pod's
    health endpoint answers. Then the pods' worker runs an acquisition (mutual-TLS Temporal,
    TLS PostgreSQL, the simulated cloud over mTLS NATS), and `sco reclaim` (the operator's
    certificate) of one of its instances has hall A's relay pod sign the notice with hall A's
    key, over mTLS NATS as its hall's identity."""
    bundle = signed_bundle(tmp_path)
    inputs = secure_inputs(
        tmp_path,
        secure_box,
        image,
        {
            "sco-contract-trust": {bundle.pub.name: bundle.pub.read_text()},
            **notice_key_secrets(bundle),
        },
    )
    played = for_podman(list(render("r1")), inputs)
    write_secret_files(played)
    configmaps = [d for d in played.docs if d["kind"] == "ConfigMap"]
    jobs = [d for d in played.docs if d["kind"] == "Pod"]
    deployments = [d for d in played.docs if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"].rsplit("-", 1)[0] for d in jobs} == {
        "sco-db-migrate",
        "sco-temporal-bootstrap",
    }
    # The contract distributor has the region's bundle before the worker's init container
    # (published over mutual-TLS NATS as the box's own control identity).
    control = secure_box.control
    await publish(control.nats_url, "r1", bundle.raw, nats_options(control))
    played_files: list[Path] = []
    cloud = SimulatedCloud(region_r1, clock=asyncio.get_running_loop().time)
    sim_nc = await nats.connect(control.nats_url, connect_timeout=5, **nats_options(control))
    sim = asyncio.create_task(serve(cloud, sim_nc))  # the pods' simulated cloud (prefix "sco")
    try:
        await play_region(jobs, deployments, configmaps, tmp_path, played_files)
        await _acquisition_and_hall_notice(secure_box, region_r1, bundle, deployments)
    finally:
        sim.cancel()
        await sim_nc.close()
        await asyncio.to_thread(
            teardown,
            list(reversed(played_files)),
            [pod for d in [*jobs, *deployments] for pod in pod_names(d)],
            [d["metadata"]["name"] for d in configmaps] + played.volumes,
        )


async def _acquisition_and_hall_notice(
    box: SecureBox, region: Region, bundle: SignedBundle, deployments: list[Doc]
) -> None:
    control = box.control
    client = await connect(control, "r1")

    await make_build_current(client, deployments)  # as the box's own identity
    pool = open_pool(postgres_conninfo(control), max_size=1)
    try:
        fleet = FleetRepository(pool)
        fleet.sync_pools(region)  # `sco pools sync`
        contract = f"kps-{uuid.uuid4().hex[:6]}"
        item = LaunchItem(pool_id="r1.A.gp.l", hall="A", flavor="gp.l", instances=1, units=1)
        handle = await client.start_workflow(
            AcquisitionWorkflow.run,
            AcquisitionInput(region="r1", contract=contract, tier=2, items=[item]),
            id=f"acq-{contract}",
            task_queue=control.temporal.task_queue("r1"),
        )
        try:
            result = await asyncio.wait_for(handle.result(), 180)
        except TimeoutError:
            raise AssertionError(f"acquisition not done in 180 s\n{logs(deployments)}") from None
        assert result.progress.state is AcquisitionState.COMPLETED, result.progress
        (instance,) = [
            i.instance_id
            for i in fleet.list_instances("r1", [InstanceState.ACTIVE], hall="A")
            if i.workload == contract
        ]
    finally:
        pool.close()

    # The notice, heard as the box's own identity: signed by hall A's relay with A's key.
    nc = await nats.connect(control.nats_url, connect_timeout=5, **nats_options(control))
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def heard(msg: Msg) -> None:
        if not got.done():
            got.set_result(msg.data)

    try:
        await nc.subscribe("sco.r1.notice.A.>", cb=heard)
        await nc.flush()
        out = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "workers.cli", "reclaim", instance, "--region", "r1",
             "--by", "test"],
            env=box.operator_env, cwd=REPO, text=True, capture_output=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr + logs(deployments)
        try:
            envelope = json.loads(await asyncio.wait_for(got, 60))
        except TimeoutError:
            raise AssertionError(f"no notice for hall A\n{logs(deployments)}") from None
    finally:
        await nc.close()
    assert envelope["key_id"] == bundle.notice_keys["A"][0], envelope
    assert (envelope["notice"]["hall"], envelope["notice"]["node"]) == ("A", instance)


def test_the_box_server_certificate_names_the_pods_address(secure_box: SecureBox) -> None:
    """verify-full as a pod does it: libpq checks the box's PostgreSQL certificate against
    10.0.2.2 (hostaddr reaches the box's loopback; host is the name verified)."""
    info = psycopg.conninfo.conninfo_to_dict(postgres_conninfo(secure_box.control))
    info.update(host=POD_HOST, hostaddr="127.0.0.1")
    with psycopg.connect(**info) as conn:  # type: ignore[arg-type]
        assert conn.execute("SELECT 1").fetchone() == (1,)
