"""TLS for SCO's clients against real TLS servers made here with a test CA (openssl):

- PostgreSQL started with `ssl=on` (the machine's initdb/pg_ctl): the fleet DB pool connects
  with sslmode=verify-full and the password from a file; a wrong CA and a wrong host name
  are refused.
- NATS (nats-server with --tlsverify): the distributor publishes with the client
  certificate; a client without one is refused.
- Temporal behind nginx terminating TLS with `ssl_verify_client on` and `grpc_pass` to the
  dev server: a region worker and the `sco` command with the client certificate run an
  acquisition to completion through it, the operator's certificate subject is recorded with
  their decision, and a client without a certificate is refused.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import nats
import psycopg
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import TLSConfig
from temporalio.testing import WorkflowEnvironment

from activities.fleet.control_state import ControlRepository
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository
from activities.provider.simulator import SimulatedCloud
from contracts.distribution import publish
from contracts.region import Region
from tests.support import services, tools
from tests.support.control_harness import (
    fallback_above_authority,
    install_example_bundle,
    region_worker,
)
from tests.support.paths import REGIONS_DIR, REPO
from tests.support.wait import eventually, eventually_async
from workers.client_security import nats_options, postgres_conninfo
from workers.devbox import tls_servers
from workers.devbox.process import port_open
from workers.settings import Settings
from workers.temporal_bootstrap import bootstrap_namespace, ensure_search_attributes
from workers.temporal_connect import connect_temporal
from workflows.acquisition.models import (
    AcquisitionInput,
    AcquisitionProgress,
    AcquisitionState,
    FallbackState,
    LaunchItem,
)
from workflows.acquisition.workflow import AcquisitionWorkflow

pytestmark = pytest.mark.timeout(180)

OPERATOR_SUBJECT = "CN=dana,O=sco-operators"


def need(tool: str, path: str | None = None) -> str:
    if tool in tools.BY_NAME:
        tools.require(tool)  # a skip, or under SCO_REQUIRE_TOOLS=1 (CI) a failure
    found = path if path and Path(path).is_file() else shutil.which(tool)
    if not found:
        pytest.skip(f"{tool} missing: apt-get install -y {tool}")
    return found


@dataclass(frozen=True)
class CertSet:
    ca: Path
    wrong_ca: Path  # a CA that signed nothing here
    server_cert: Path  # for "localhost" only
    server_key: Path
    client_cert: Path  # OPERATOR_SUBJECT
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)  # fmt: skip


def _signed(d: Path, name: str, subject: str, ext: str) -> None:
    (d / f"{name}.ext").write_text(ext)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.crt",
             "-extfile", f"{name}.ext", cwd=d)  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    need("openssl")
    d = tmp_path_factory.mktemp("ca")
    _ca(d, "ca")
    _ca(d, "wrong-ca")
    _signed(d, "server", "/CN=localhost", "subjectAltName=DNS:localhost\n"
            "extendedKeyUsage=serverAuth\n")  # fmt: skip
    _signed(d, "client", "/O=sco-operators/CN=dana", "extendedKeyUsage=clientAuth\n")
    for key in d.glob("*.key"):
        key.chmod(0o600)
    return CertSet(
        d / "ca.crt", d / "wrong-ca.crt", d / "server.crt", d / "server.key",
        d / "client.crt", d / "client.key",
    )  # fmt: skip


# -- PostgreSQL ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsPostgres:
    port: int
    password_file: Path


@pytest.fixture(scope="module")
def tls_postgres(certs: CertSet) -> Iterator[TlsPostgres]:
    bin_dir = tls_servers.postgres_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries missing: apt-get install -y postgresql")
    pg_ctl = need("pg_ctl", str(bin_dir / "pg_ctl"))
    user = tls_servers.postgres_run_as()
    # Outside pytest's tmp tree: that is private to root, and the server runs as postgres.
    base = Path(tempfile.mkdtemp(prefix="sco-pgtls-"))
    base.chmod(0o755)
    tls_servers.give_to(user, base)  # the server writes its log and socket there
    data, secrets = base / "data", base / "secrets"
    (base / "pw").write_text(uuid.uuid4().hex + "\n")
    (base / "pw").chmod(0o600)
    pw = tls_servers.copy_private(base / "pw", secrets / "pw", user)
    cert = tls_servers.copy_private(certs.server_cert, secrets / "server.crt", user)
    key = tls_servers.copy_private(certs.server_key, secrets / "server.key", user)
    ca = tls_servers.copy_private(certs.ca, secrets / "ca.crt", user)
    tls_servers.init_postgres(bin_dir, data, pw, user)
    port = services.free_port()
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(tls_servers.tls_postgres_conf("127.0.0.1", port, cert, key, ca, base))
    # Only TLS connections, with a password: a client that skips TLS is refused too.
    (data / "pg_hba.conf").write_text(tls_servers.tls_only_hba(client_cert=False))
    subprocess.run(
        [pg_ctl, "-D", str(data), "-l", str(base / "log"), "-w", "-t", "30", "start"],
        check=True, capture_output=True, user=user,
    )  # fmt: skip
    try:
        yield TlsPostgres(port, base / "pw")
    finally:
        subprocess.run([pg_ctl, "-D", str(data), "-m", "fast", "stop"], check=False, user=user)
        shutil.rmtree(base, ignore_errors=True)


def pg_settings(pg: TlsPostgres, ca: Path, host: str = "localhost") -> Settings:
    return Settings(
        postgres_dsn=f"postgresql://postgres@{host}:{pg.port}/postgres?connect_timeout=5",
        postgres={
            "sslmode": "verify-full",
            "sslrootcert_file": ca,
            "password_file": pg.password_file,
        },
    )


def test_the_fleet_pool_connects_with_verify_full(
    tls_postgres: TlsPostgres, certs: CertSet
) -> None:
    s = pg_settings(tls_postgres, certs.ca)
    pool = open_pool(postgres_conninfo(s), max_size=1)
    try:
        with pool.connection() as conn:
            row = conn.execute(
                "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
            ).fetchone()
    finally:
        pool.close()
    assert row is not None and row[0] is True and row[1].startswith("TLSv1")
    assert tls_postgres.password_file.read_text().strip() not in repr(s)


@pytest.mark.parametrize(
    ("which", "host", "why"),
    [
        ("wrong CA", "localhost", "certificate verify failed"),
        ("wrong host name", "127.0.0.1", "does not match host name"),
    ],
)
def test_verify_full_refuses(
    tls_postgres: TlsPostgres, certs: CertSet, which: str, host: str, why: str
) -> None:
    ca = certs.wrong_ca if which == "wrong CA" else certs.ca
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(postgres_conninfo(pg_settings(tls_postgres, ca, host))).close()
    assert why in str(refused.value)


async def test_sco_db_migrate_over_tls(tls_postgres: TlsPostgres, certs: CertSet) -> None:
    env = {
        **os.environ,
        "SCO_POSTGRES_DSN": f"postgresql://postgres@localhost:{tls_postgres.port}/sco",
        "SCO_POSTGRES__SSLMODE": "verify-full",
        "SCO_POSTGRES__SSLROOTCERT_FILE": str(certs.ca),
        "SCO_POSTGRES__PASSWORD_FILE": str(tls_postgres.password_file),
    }
    code, out = await services.run_sco(env, "db", "migrate", cwd=REPO)
    assert code == 0 and "schema at version" in out, out
    code, out = await services.run_sco(
        {**env, "SCO_POSTGRES__SSLROOTCERT_FILE": str(certs.wrong_ca)}, "db", "migrate", cwd=REPO
    )
    assert code == 1 and out.startswith("error: ") and "certificate verify failed" in out, out
    assert tls_postgres.password_file.read_text().strip() not in out


# -- Temporal through nginx with client-certificate verification ----------------------------


@pytest.fixture
def mtls_proxy(
    dev_server_env: WorkflowEnvironment, certs: CertSet, tmp_path: Path
) -> Iterator[str]:
    """nginx on a free port: TLS with `ssl_verify_client on`, gRPC to the dev server."""
    nginx = need("nginx")
    upstream = dev_server_env.client.service_client.config.target_host
    port = services.free_port()
    run = tmp_path / "nginx"
    argv = tls_servers.nginx_argv(
        nginx,
        run,
        tls_servers.nginx_grpc_mtls_conf(
            run, "127.0.0.1", port, certs.server_cert, certs.server_key, certs.ca, upstream
        ),
    )
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE)
    try:

        def listening() -> bool:
            if port_open("127.0.0.1", port):
                return True
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"nginx did not start: {err}")
            return False

        eventually(listening, timeout=30, what=f"nginx listening on {port}", retrying=())
        yield f"localhost:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def temporal_settings(address: str, ca: CertSet, prefix: str, with_cert: bool = True) -> Settings:
    tls: dict[str, object] = {"enabled": True, "ca_file": ca.ca}
    if with_cert:
        tls |= {"client_cert_file": ca.client_cert, "client_key_file": ca.client_key}
    return Settings(temporal={"address": address, "namespace_prefix": prefix, "tls": tls})


def tls_env(s: Settings) -> dict[str, str]:
    t = s.temporal
    env = {
        **os.environ,
        "SCO_TEMPORAL__ADDRESS": t.address,
        "SCO_TEMPORAL__NAMESPACE_PREFIX": t.namespace_prefix,
        "SCO_TEMPORAL__TLS__ENABLED": "true",
        "SCO_TEMPORAL__TLS__CA_FILE": str(t.tls.ca_file),
    }
    if t.tls.client_cert_file and t.tls.client_key_file:
        env["SCO_TEMPORAL__TLS__CLIENT_CERT_FILE"] = str(t.tls.client_cert_file)
        env["SCO_TEMPORAL__TLS__CLIENT_KEY_FILE"] = str(t.tls.client_key_file)
    return env


async def test_a_client_without_a_certificate_is_refused(mtls_proxy: str, certs: CertSet) -> None:
    no_cert = temporal_settings(mtls_proxy, certs, "", with_cert=False)
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(connect_temporal(no_cert), 20)
    with pytest.raises(RuntimeError):  # and one that does not speak TLS at all
        await asyncio.wait_for(
            Client.connect(mtls_proxy, data_converter=pydantic_data_converter), 20
        )
    wrong_ca = TLSConfig(
        server_root_ca_cert=certs.wrong_ca.read_bytes(),
        client_cert=certs.client_cert.read_bytes(),
        client_private_key=certs.client_key.read_bytes(),
    )
    with pytest.raises(RuntimeError):  # nor one that cannot verify the proxy
        await asyncio.wait_for(Client.connect(mtls_proxy, tls=wrong_ca), 20)


async def test_worker_and_cli_run_an_acquisition_through_the_mtls_proxy(
    dev_server_env: WorkflowEnvironment,
    mtls_proxy: str,
    certs: CertSet,
    fleet_repo: FleetRepository,
    region_r1: Region,
    tmp_path: Path,
    pg_dsn: str,
) -> None:
    prefix = f"tls{uuid.uuid4().hex[:6]}-"
    await bootstrap_namespace(dev_server_env.client, f"{prefix}r1", timedelta(days=1))
    s = temporal_settings(mtls_proxy, certs, prefix)
    client = await connect_temporal(s, s.temporal.namespace("r1"))  # through nginx
    await ensure_search_attributes(client, client.namespace)
    cache, trust = install_example_bundle(tmp_path / "contracts")
    cloud = SimulatedCloud(region_r1, clock=asyncio.get_running_loop().time)
    control = ControlRepository(fleet_repo._pool)
    env = {**tls_env(s), "SCO_POSTGRES_DSN": pg_dsn, "SCO_REGIONS_DIR": str(REGIONS_DIR)}
    async with region_worker(
        client, cloud, fleet_repo, control, bundle_dir=cache, trust_dir=trust, queue="sco-r1"
    ):
        contract = f"tls-{uuid.uuid4().hex[:6]}"
        item = LaunchItem(pool_id="r1.A.gp.l", hall="A", flavor="gp.l", instances=2, units=2)
        handle = await client.start_workflow(
            AcquisitionWorkflow.run,
            AcquisitionInput(region="r1", contract=contract, tier=2, items=[item]),
            id=f"acq-{contract}",
            task_queue="sco-r1",
        )
        result = await asyncio.wait_for(handle.result(), 60)
        assert result.progress.state is AcquisitionState.COMPLETED
        assert result.progress.active == 2

        # The CLI through the proxy, with the certificate: reads the acquisition.
        code, out = await services.run_sco(env, "acquisitions", "show", handle.id, cwd=REPO)
        assert code == 0 and "completed" in out, out
        # Without a certificate: refused, one line.
        no_cert = {k: v for k, v in env.items() if not k.endswith(("_CERT_FILE", "_KEY_FILE"))}
        code, out = await services.run_sco(no_cert, "acquisitions", "show", handle.id, cwd=REPO)
        assert code == 1 and "error" in out, out

        # An operator decision through the proxy carries the certificate's subject.
        waiting = await client.start_workflow(
            AcquisitionWorkflow.run,
            AcquisitionInput(
                region="r1", contract=contract, tier=2, fallback=fallback_above_authority(contract)
            ),
            id=f"acq-{contract}-fb",
            task_queue="sco-r1",
        )

        async def awaiting() -> bool:
            p: AcquisitionProgress = await waiting.query(AcquisitionWorkflow.progress)
            return p.fallback is FallbackState.AWAITING_APPROVAL

        await eventually_async(
            awaiting, timeout=60, what=f"{waiting.id} waiting for approval", retrying=()
        )
        code, out = await services.run_sco(
            env, "acquisitions", "approve", waiting.id, "--by", "dana", "--reason", "tls", cwd=REPO
        )
        assert code == 0, out
        await asyncio.wait_for(waiting.result(), 60)
    with fleet_repo._pool.connection() as conn:
        rows = conn.execute(
            """SELECT payload->>'outcome', payload->>'actor', payload->>'identity' FROM outbox
               WHERE topic = 'sco.r1.decisions' AND payload->>'workflow_id' = %s
                 AND payload->>'actor' = 'dana'""",
            (waiting.id,),
        ).fetchall()
    assert rows == [("approved", "dana", OPERATOR_SUBJECT)], rows


# -- NATS with client-certificate verification ----------------------------------------------


@pytest.fixture
def tls_nats(certs: CertSet, tmp_path: Path) -> Iterator[str]:
    binary = need("nats-server", str(Path(sys.executable).parent / "nats-server"))
    port = services.free_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(
        tls_servers.nats_tls_config(
            "127.0.0.1", port, tmp_path / "js", certs.server_cert, certs.server_key, certs.ca
        )
    )
    proc = subprocess.Popen(
        [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        eventually(
            lambda: port_open("127.0.0.1", port),
            timeout=30,
            what=f"nats-server listening on {port}",
            retrying=(),
        )
        yield f"nats://localhost:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


async def test_nats_over_mtls_publishes_a_bundle_and_refuses_no_certificate(
    tls_nats: str, certs: CertSet
) -> None:
    tls = {"enabled": True, "ca_file": certs.ca}
    with_cert = Settings(
        nats_url=tls_nats,
        nats_tls=tls | {"client_cert_file": certs.client_cert, "client_key_file": certs.client_key},
    )
    published = await publish(with_cert.nats_url, "r1", b"{}", nats_options(with_cert))
    assert published.bucket == "sco-contracts-r1" and published.size == 2
    no_cert = Settings(nats_url=tls_nats, nats_tls=tls)
    with pytest.raises(Exception) as refused:  # nats-py raises several unrelated types
        nc = await nats.connect(
            no_cert.nats_url,
            connect_timeout=3,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            **nats_options(no_cert),
        )
        await nc.close()
    assert isinstance(refused.value, (OSError, nats.errors.Error)), repr(refused.value)
