"""A real three-member Patroni cluster on this machine, for failover tests: one etcd (the
DCS, Debian's etcd-server), three Patroni daemons (Patroni from the venv) running the
machine's PostgreSQL binaries on free ports, everything under one temporary directory.

Each member's configuration is the shipped one (deploy/patroni/patroni-r1.example.yml) with
only what a single host needs changed: loopback addresses and free ports, a test CA's
certificates in place of the real ones (TLS stays on for PostgreSQL, the REST API and
etcd), the loopback network in place of the halls' in pg_hba, and short DCS timings so a
failover takes seconds. Member `c` is tagged `nosync` as hall C's node is: `b` is the
synchronous standby, `c` the asynchronous one.

PostgreSQL refuses to run as root: as root, the cluster runs as the `postgres` user (its
files in a directory it owns, Patroni on a Python it can execute with the venv's packages).
The machine's own PostgreSQL (5432, /var/run/postgresql) is never touched.
"""

from __future__ import annotations

import datetime
import importlib.util
import ipaddress
import json
import os
import pwd
import shutil
import signal
import ssl
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.paths import REPO
from tests.support.services import free_port
from tests.support.wait import WaitTimeout, eventually

SHIPPED = REPO / "deploy" / "patroni" / "patroni-r1.example.yml"
MEMBERS = ("a", "b", "c")
#: Test-only passwords of the cluster's roles (loopback, throwaway data directory).
PASSWORD = "sco-test-" + uuid.uuid4().hex[:12]
#: The role and database SCO uses (the shipped pg_hba's `hostssl sco sco` rule).
SCO_USER = SCO_DB = "sco"


class ClusterError(RuntimeError):
    """The cluster did not reach the state asked for in time; the message says which."""


def postgres_bin_dir() -> Path | None:
    """The newest of the machine's PostgreSQL server installations, if any."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return found[-1].parent if found else None


def missing_prerequisite() -> str | None:
    """Why the cluster cannot run here (one line), or None."""
    if shutil.which("etcd") is None:
        return "missing tool: etcd-server (make deps, or: apt-get install etcd-server)"
    if postgres_bin_dir() is None:
        return "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
    if importlib.util.find_spec("patroni") is None:
        return "patroni is not installed in the venv (pip install -e '.[dev]')"
    if os.geteuid() == 0 and _patroni_python() is None:
        return "no Python the postgres user can run Patroni with"
    return None


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged user the cluster runs as when we are root; None: as ourselves."""
    return pwd.getpwnam("postgres") if os.geteuid() == 0 else None


def _patroni_python() -> str | None:
    """A Python of our version that the cluster's user can execute, to run the venv's
    Patroni with (ours may live in a directory only root can enter)."""
    user = _run_as()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for exe in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if not Path(exe).exists():
            continue
        if user is None:
            return exe
        ok = subprocess.run(
            ["runuser", "-u", user.pw_name, "--", exe, "-c", "import sys"],
            capture_output=True,
            timeout=30,
        )
        if ok.returncode == 0:
            return exe
    return None


def _write_test_pki(out: Path) -> None:
    """A throwaway CA and one certificate (server and client use) for 127.0.0.1."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sco-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (out / "ca.crt").write_bytes(ca.public_bytes(pem))
    (out / "server.crt").write_bytes(cert.public_bytes(pem))
    (out / "server.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (out / "server.key").chmod(0o600)


@dataclass
class Member:
    name: str
    pg_port: int
    api_port: int
    data_dir: Path
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid (postmaster.pid's first line), or None."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return None
        return pid


@dataclass
class PatroniCluster:
    base: Path
    members: list[Member] = field(default_factory=list)
    etcd_port: int = 0
    etcd: subprocess.Popen[bytes] | None = None
    scope: str = field(default_factory=lambda: f"sco-test-{uuid.uuid4().hex[:8]}")

    # -- configuration --------------------------------------------------------------------

    def member_config(self, m: Member) -> dict[str, Any]:
        """The shipped configuration with the single-host changes (module docstring)."""
        conf: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
        tls = self.base / "tls"
        cert, key, ca = str(tls / "server.crt"), str(tls / "server.key"), str(tls / "ca.crt")
        conf["scope"] = self.scope
        conf["name"] = f"pg-{m.name}"
        api = f"127.0.0.1:{m.api_port}"
        conf["restapi"].update(listen=api, connect_address=api, certfile=cert, keyfile=key)
        conf["restapi"]["cafile"] = ca
        conf["restapi"]["authentication"]["password"] = PASSWORD
        conf["ctl"] = {"cacert": ca, "certfile": cert, "keyfile": key}
        conf["etcd3"].update(hosts=f"127.0.0.1:{self.etcd_port}", cacert=ca, cert=cert, key=key)
        dcs = conf["bootstrap"]["dcs"]
        # Seconds, not tens of seconds: a failover inside a test's patience (the shipped
        # primary_start_timeout, 0, already fails over on a crash instead of restarting).
        dcs.update(ttl=20, loop_wait=2, retry_timeout=5)
        params = dcs["postgresql"]["parameters"]
        params.update(
            ssl_cert_file=cert,
            ssl_key_file=key,
            ssl_ca_file=ca,
            max_connections=60,
            wal_keep_size="128MB",
        )
        pg = conf["postgresql"]
        listen = f"127.0.0.1:{m.pg_port}"
        pg.update(listen=listen, connect_address=listen, data_dir=str(m.data_dir))
        pg["bin_dir"] = str(postgres_bin_dir())
        # The socket in our directory, never the machine's /var/run/postgresql.
        pg["parameters"] = {
            "unix_socket_directories": str(self.base / "run"),
            "shared_buffers": "32MB",
        }
        pg["pgpass"] = str(self.base / "run" / f"pgpass-{m.name}")
        for role in pg["authentication"].values():
            role["password"] = PASSWORD
        pg["authentication"]["replication"]["sslrootcert"] = ca
        pg["pg_hba"] = [
            rule.replace("10.11.0.0/24", "127.0.0.1/32").replace("10.11.64.0/18", "127.0.0.1/32")
            for rule in pg["pg_hba"]
        ]
        conf["tags"]["nosync"] = m.name == "c"
        conf["log"] = {"level": "INFO"}
        return conf

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    def create(cls) -> PatroniCluster:
        # Not pytest's tmp_path: that is private to root, and the cluster's user must enter.
        base = Path(tempfile.mkdtemp(prefix="sco-patroni-"))
        base.chmod(0o755)
        cluster = cls(base)
        for d in ("tls", "run", "etcd", "logs"):
            (base / d).mkdir()
        _write_test_pki(base / "tls")
        cluster.etcd_port = free_port()
        for name in MEMBERS:
            cluster.members.append(
                Member(
                    name=name,
                    pg_port=free_port(),
                    api_port=free_port(),
                    data_dir=base / f"data-{name}",
                    config=base / f"patroni-{name}.yml",
                    log=base / "logs" / f"patroni-{name}.log",
                )
            )
        for m in cluster.members:
            m.config.write_text(yaml.safe_dump(cluster.member_config(m), sort_keys=False))
        if user := _run_as():
            for path in [base, *base.rglob("*")]:
                if not path.is_relative_to(base / "etcd"):
                    os.chown(path, user.pw_uid, user.pw_gid)
        return cluster

    def start(self, within: float = 300.0) -> None:
        """etcd, then the three members; returns once there is a leader, `b` streams as the
        synchronous standby and `c` streams asynchronously."""
        deadline = time.monotonic() + within
        self._start_etcd()
        # `a` first, so that it is the one that initialises the cluster and leads.
        self.start_member(self.members[0])
        self.wait_for(
            lambda c: self._roles(c).get("pg-a") == "leader", within, "a leads the new cluster"
        )
        for m in self.members[1:]:
            self.start_member(m)
        self.wait_for(
            lambda c: self._roles(c) == {"pg-a": "leader", "pg-b": "sync", "pg-c": "async"},
            max(1.0, deadline - time.monotonic()),
            "a leader (a), a streaming synchronous standby (b) and asynchronous one (c)",
        )

    @staticmethod
    def healthy(state: dict[str, Any] | None) -> bool:
        """One leader, one synchronous and one asynchronous standby, all streaming."""
        return sorted(PatroniCluster._roles(state).values()) == ["async", "leader", "sync"]

    def _start_etcd(self) -> None:
        tls = self.base / "tls"
        peer = free_port()
        url = f"https://127.0.0.1:{self.etcd_port}"
        self.etcd = subprocess.Popen(
            [
                "etcd",
                "--name=e0",
                f"--data-dir={self.base / 'etcd' / 'data'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=e0=http://127.0.0.1:{peer}",
                f"--cert-file={tls / 'server.crt'}",
                f"--key-file={tls / 'server.key'}",
                f"--trusted-ca-file={tls / 'ca.crt'}",
                "--client-cert-auth",
            ],
            stdout=(self.base / "logs" / "etcd.log").open("wb"),
            stderr=subprocess.STDOUT,
        )

    def start_member(self, m: Member) -> None:
        python = _patroni_python()
        assert python is not None
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.base / "run"),
            "PYTHONPATH": sysconfig.get_paths()["purelib"],
            "LANG": "C.UTF-8",
        }
        user = _run_as()
        m.proc = subprocess.Popen(
            # -S: the venv's packages only (PYTHONPATH), never the system's dist-packages.
            [python, "-S", "-m", "patroni", str(m.config)],
            cwd=self.base,
            env=env,
            stdout=m.log.open("ab"),
            stderr=subprocess.STDOUT,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
            start_new_session=True,
        )

    def stop(self) -> None:
        for m in self.members:
            if m.proc is not None and m.proc.poll() is None:
                m.proc.terminate()
        for m in self.members:
            if m.proc is not None:
                try:
                    m.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(m.proc.pid, signal.SIGKILL)
                    m.proc.wait(timeout=10)
            # A postmaster that outlived its Patroni (it was killed) must not linger.
            if (pid := m.postmaster_pid()) is not None:
                os.kill(pid, signal.SIGKILL)
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait(timeout=10)
        shutil.rmtree(self.base, ignore_errors=True)

    # -- state ----------------------------------------------------------------------------

    def cluster_state(self) -> dict[str, Any] | None:
        """GET /cluster from the first member that answers (TLS, verified), or None."""
        ctx = ssl.create_default_context(cafile=str(self.base / "tls" / "ca.crt"))
        for m in self.members:
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{m.api_port}/cluster", context=ctx, timeout=5
                ) as resp:
                    state: dict[str, Any] = json.load(resp)
                    return state
            except OSError:
                continue
        return None

    @staticmethod
    def _roles(state: dict[str, Any] | None) -> dict[str, str]:
        """Member name -> leader / sync / async (streaming standbys only) / down."""
        out: dict[str, str] = {}
        for m in (state or {}).get("members", []):
            role, st = m.get("role"), m.get("state")
            if role == "leader" and st == "running":
                out[m["name"]] = "leader"
            elif role in ("sync_standby", "replica") and st == "streaming":
                out[m["name"]] = "sync" if role == "sync_standby" else "async"
            else:
                out[m["name"]] = "down"
        return out

    def roles(self) -> dict[str, str]:
        return self._roles(self.cluster_state())

    def leader(self) -> Member:
        for name, role in self.roles().items():
            if role == "leader":
                return self.member(name)
        raise ClusterError(f"no leader: {self.roles()}")

    def member(self, name: str) -> Member:
        return next(m for m in self.members if f"pg-{m.name}" == name or m.name == name)

    def wait_for(
        self, check: Callable[[dict[str, Any] | None], bool], within: float, what: str
    ) -> None:
        state = None

        def holds() -> bool:
            nonlocal state
            state = self.cluster_state()
            if check(state):
                return True
            for m in self.members:
                if m.proc is not None and m.proc.poll() is not None:
                    tail = m.log.read_text(errors="replace").splitlines()[-5:]
                    raise ClusterError(f"Patroni {m.name} exited: {' | '.join(tail)}")
            return False

        try:
            eventually(holds, timeout=within, what=what, every=0.5, retrying=())
        except WaitTimeout as exc:
            raise ClusterError(f"{exc}; roles {self._roles(state)}; logs in {self.base}") from exc

    def kill_postgres(self, m: Member) -> int:
        """SIGKILL the member's postmaster (its Patroni stays); returns the pid killed."""
        pid = m.postmaster_pid()
        if pid is None:
            raise ClusterError(f"member {m.name} has no running postmaster")
        os.kill(pid, signal.SIGKILL)
        return pid

    def patroni_alive(self) -> int:
        return sum(1 for m in self.members if m.proc is not None and m.proc.poll() is None)

    # -- connection strings ---------------------------------------------------------------

    def dsn(self, *, user: str = SCO_USER, dbname: str = SCO_DB) -> str:
        """SCO's multi-host connection string: every member, the writable one is chosen."""
        hosts = ",".join("127.0.0.1" for _ in self.members)
        ports = ",".join(str(m.pg_port) for m in self.members)
        ca = self.base / "tls" / "ca.crt"
        return (
            f"host={hosts} port={ports} dbname={dbname} user={user} password={PASSWORD} "
            f"sslmode=verify-full sslrootcert={ca} target_session_attrs=read-write"
        )

    def create_sco_database(self) -> str:
        """The `sco` role and database on the leader; returns SCO's DSN."""
        import psycopg

        admin = self.dsn(user="postgres", dbname="postgres")
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"CREATE ROLE {SCO_USER} LOGIN PASSWORD '{PASSWORD}'")
            conn.execute(f"CREATE DATABASE {SCO_DB} OWNER {SCO_USER}")
        return self.dsn()
