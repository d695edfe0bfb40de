"""One typed settings model for every SCO control-plane process.

Sources, highest first: explicit overrides, `SCO_*` environment variables (nested with
`__`, e.g. `SCO_TEMPORAL__ADDRESS`), the TOML file named by `SCO_CONFIG` (default
`sco.toml` in the working directory, optional), then the defaults below, which are the
embedded local region in a box.

The sources are read here (`_sources`), as pydantic-settings' BaseSettings read them
(case-insensitive names, lists and tables as JSON, `__` into nested tables, deep merge),
without loading pydantic-settings: its source providers, python-dotenv and argparse cost
every process ~1 MB and none is used (decision 0035).
"""

from __future__ import annotations

import json
import os
import tomllib
import types
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from contracts.logformat import LogFormat
from contracts.redact import mask_credentials

if TYPE_CHECKING:
    # At run time only in timeouts(): activities.fleet.db imports psycopg (~20 MB), which
    # the processes without fleet state (drain intake, agent tools, `sco --help`) skip.
    from activities.fleet.db import DbTimeouts

CONFIG_ENV = "SCO_CONFIG"
DEFAULT_CONFIG_FILE = Path("sco.toml")
#: `SCO_TEMPORAL__ADDRESS` is `temporal.address`.
ENV_PREFIX = "SCO_"
ENV_NESTED_DELIMITER = "__"


class TLSSettings(BaseModel):
    """TLS to one service. Every secret is a file (as a Kubernetes Secret mount gives it),
    read when the client is made, so no secret is held in settings or printed with them."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    # The CA that signed the server's certificate; None: the system's trust store.
    ca_file: Path | None = None
    # A client certificate and its key, for servers that verify clients (mTLS).
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    # The name the server's certificate must carry, when it differs from the address's host.
    server_name: str = ""

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> TLSSettings:
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("client_cert_file and client_key_file go together")
        if not self.enabled and (self.ca_file or self.client_cert_file or self.server_name):
            raise ValueError("TLS files or server_name are set but enabled is false")
        return self


class NatsAuthSettings(BaseModel):
    """Who this process is to NATS: one of the per-role users `sco nats-users` renders
    (workers/nats_permissions.py: control-<region>, operator-<region>, relay-<region>-<hall>)
    with its password file, a credentials (JWT + nkey) file, an nkey seed file, or a token
    file. Every one is a file, read when the connection is made; none: no credentials (the
    region in a box's NATS). A client certificate for mutual TLS is `nats_tls`."""

    model_config = ConfigDict(extra="forbid")

    # The per-role user, e.g. control-r1 or relay-r1-A (SCO_NATS_AUTH__USER per process).
    user: str = ""
    # The user's password alone (`<user>.password`); used only with `user`.
    password_file: Path | None = None
    # A decentralised-auth .creds file (JWT and nkey seed).
    creds_file: Path | None = None
    # An nkey seed (SU...) file.
    nkey_seed_file: Path | None = None
    # A token alone.
    token_file: Path | None = None

    @model_validator(mode="after")
    def _one_way_in(self) -> NatsAuthSettings:
        # A password file alone is fine: the user may come from elsewhere (the environment:
        # one settings file for every process, one NATS user per process kind). A user
        # without one is named by its client certificate (Settings checks nats_tls has it).
        ways = [
            name
            for name, on in (
                ("user", bool(self.user)),
                ("creds_file", self.creds_file is not None),
                ("nkey_seed_file", self.nkey_seed_file is not None),
                ("token_file", self.token_file is not None),
            )
            if on
        ]
        if len(ways) > 1:
            raise ValueError(f"one NATS credential at a time, not {' and '.join(ways)}")
        return self


class BoxSettings(BaseModel):
    """The region in a box (`sco dev up`)."""

    model_config = ConfigDict(extra="forbid")

    # default: plaintext on loopback, the machine's PostgreSQL and NATS when they answer.
    # secure: the box's own TLS-only PostgreSQL, NATS, Temporal and Kafka (the last two
    # behind nginx, mutual TLS), every process with a certificate of the box's CA (`sco dev
    # up --profile secure`).
    profile: Literal["default", "secure"] = "default"
    # The secure profile's listeners, on 127.0.0.1 (apart from the default profile's, so
    # the machine's shared PostgreSQL and NATS keep theirs).
    secure_postgres_port: int = Field(default=5433, ge=1, le=65535)
    secure_nats_port: int = Field(default=4223, ge=1, le=65535)
    secure_temporal_port: int = Field(default=7234, ge=1, le=65535)
    # The Temporal dev server nginx passes to: loopback only, plaintext (it has no TLS).
    secure_temporal_backend_port: int = Field(default=7235, ge=1, le=65535)
    # The tansu broker nginx passes Kafka to: loopback only, plaintext (tansu 0.6 has no
    # TLS). Clients reach nginx's mutual-TLS listener at `kafka.bootstrap_servers`, which
    # the broker advertises in its metadata.
    secure_kafka_backend_port: int = Field(default=19093, ge=1, le=65535)
    # Where the secure profile's processes get their certificates: `openbao`, the box's
    # OpenBao PKI role of each kind (each process renews its own; `identity.ttl_seconds`
    # and `identity.renew_fraction` of the box's settings); `box-ca`, a 30-day certificate
    # of the box's own CA, never renewed while running.
    secure_cert_source: Literal["openbao", "box-ca"] = "openbao"


class TemporalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: str = "127.0.0.1:7233"
    tls: TLSSettings = TLSSettings()
    ui_port: int = 8233
    # The Temporal UI as operators reach it, for the links the CLI prints; empty:
    # http://127.0.0.1:<ui_port> (the region in a box).
    ui_url: str = ""
    # Each region has its own namespace so regions share nothing on the control path.
    namespace_prefix: str = ""
    retention_days: int = Field(default=7, ge=1)

    def namespace(self, region: str) -> str:
        return f"{self.namespace_prefix}{region}"

    def task_queue(self, region: str) -> str:
        return f"sco-{region}"

    def effective_ui_url(self) -> str:
        return (self.ui_url or f"http://127.0.0.1:{self.ui_port}").rstrip("/")


class KafkaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bootstrap_servers: str = "127.0.0.1:19092"
    # TLS to the brokers (security.protocol SSL, or SASL_SSL with a SASL user below).
    tls: TLSSettings = TLSSettings()
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    sasl_username: str = ""
    sasl_password_file: Path | None = None
    partitions: int = Field(default=6, ge=1)
    replication_factor: int = Field(default=1, ge=1)
    # The producer refuses a bigger event (it becomes a dead letter, with the reason).
    max_message_bytes: int = Field(default=1_000_000, ge=1000)


class ProviderSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # simulator: the simulated cloud service (`sco sim serve`), the embedded default.
    # openstack: the region's OpenStack through openstacksdk (clouds.yaml, OS_CLOUD, OS_*).
    kind: Literal["simulator", "openstack"] = "simulator"
    openstack_cloud: str = "sco-testcloud"  # the clouds.yaml entry of this region
    image: str = "sco-image"
    network: str = "none"
    # NATS subject prefix of the simulated cloud service (<prefix>.<region>.sim.*).
    simulator_prefix: str = "sco"
    # The simulated cloud service's Prometheus metrics and GET /healthz, /readyz (503
    # while NATS is away); 0 turns each off.
    simulator_metrics_port: int = Field(default=0, ge=0, le=65535)
    simulator_health_port: int = Field(default=0, ge=0, le=65535)
    # The provider's own limit on mutating API calls (what it throttles above): the region's
    # token budget (`control.budget_*`, `sco budget set-rate`) stays within it.
    api_rate_limit_per_second: float = Field(default=50.0, gt=0)
    api_burst_limit: int = Field(default=200, ge=1)


class OutboxSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(default=2000, ge=1)
    # The relay wakes on NOTIFY; this is only the safety net for a lost notification.
    idle_poll_seconds: float = Field(default=1.0, gt=0)
    # Sent rows are kept this long (for audits and re-publishing), then deleted by the relay.
    retention_hours: float = Field(default=24.0, ge=0)
    # A row Kafka refuses this many times is parked as a dead letter (`sco outbox
    # dead-letters`); broker outages never count toward it.
    max_attempts: int = Field(default=5, ge=1)
    # A message not acknowledged in this long expires in the producer; the relay then
    # makes a new producer (the broker may have lost its state) and sends the row again.
    message_timeout_seconds: float = Field(default=30.0, gt=0)
    # Prometheus metrics of the relay (sco_outbox_*, sco_dead_letters_total) and its
    # GET /healthz, /readyz (503 unless PostgreSQL and Kafka answer); 0 turns each off.
    metrics_port: int = Field(default=0, ge=0, le=65535)
    health_port: int = Field(default=0, ge=0, le=65535)


class PrometheusSettings(BaseModel):
    """The region in a box's Prometheus (`sco dev up --workers`, Debian's `prometheus`)."""

    model_config = ConfigDict(extra="forbid")

    port: int = Field(default=9090, ge=1, le=65535)
    # Recording and alert rules it loads (every *.yml here).
    rules_dir: Path = Path("deploy/prometheus/rules")
    scrape_seconds: float = Field(default=5.0, gt=0)
    evaluation_seconds: float = Field(default=5.0, gt=0)
    # The box's processes serve metrics and health on consecutive ports from here (the
    # order of `sco dev status`); the scrape config names the same ports.
    box_ports_from: int = Field(default=9470, ge=1024, le=65000)
    # A box of several regions (`sco dev up --regions r1,r2,r3`): region i's Prometheus
    # listens on `port` + i and its processes take ports from `box_ports_from` + 32 i;
    # the global Prometheus federating them listens here.
    global_port: int = Field(default=9089, ge=1, le=65535)


class NoticeRelaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # A relay that lost a dependency (fleet state, NATS) retries at most this far apart.
    max_backoff_seconds: float = Field(default=10.0, gt=0)
    # Each call that tells a pool's exclusion cycle about a notice gives up after this;
    # it is retried in the background and never holds up a notice (the region worker
    # makes these calls from the notice stream: workers/notice_hooks.py).
    hook_timeout_seconds: float = Field(default=5.0, gt=0)
    # GET /healthz, /readyz (503 while a dependency is away) and Prometheus metrics
    # (sco_notice_relay_degraded); 0 turns each off. One relay per hall: give each its own.
    health_port: int = Field(default=0, ge=0, le=65535)
    metrics_port: int = Field(default=0, ge=0, le=65535)


#: The shortest start-to-close of an activity that writes fleet state (workflows/): a
#: database wait must give up inside it, or Temporal times the activity out while it
#: still blocks a worker slot.
FLEET_ACTIVITY_START_TO_CLOSE_SECONDS = 30.0


class FleetDbSettings(BaseModel):
    """Bounded waits on fleet state (PostgreSQL), for every process's pool."""

    model_config = ConfigDict(extra="forbid")

    connect_timeout_seconds: float = Field(default=5.0, ge=2)
    # Server-side (`-c statement_timeout`): a statement stuck on a lock or a failing
    # primary is cancelled by the server, not left for Temporal to time out.
    statement_timeout_seconds: float = Field(default=15.0, gt=0)
    # How long a checkout waits for a free or new connection before PoolTimeout.
    pool_timeout_seconds: float = Field(default=8.0, gt=0)

    @model_validator(mode="after")
    def _inside_activity_timeout(self) -> FleetDbSettings:
        worst = self.pool_timeout_seconds + self.statement_timeout_seconds
        if worst >= FLEET_ACTIVITY_START_TO_CLOSE_SECONDS:
            raise ValueError(
                f"pool_timeout_seconds + statement_timeout_seconds = {worst:g} s must be "
                f"below the fleet activities' start-to-close "
                f"({FLEET_ACTIVITY_START_TO_CLOSE_SECONDS:g} s)"
            )
        return self

    def timeouts(self) -> DbTimeouts:
        from activities.fleet.db import DbTimeouts

        return DbTimeouts(
            connect=self.connect_timeout_seconds,
            statement=self.statement_timeout_seconds,
            pool=self.pool_timeout_seconds,
        )


class PostgresSettings(BaseModel):
    """TLS and credentials for fleet state, added to `postgres_dsn` when connecting."""

    model_config = ConfigDict(extra="forbid")

    # libpq sslmode; "verify-full" checks the server's certificate and host name.
    sslmode: Literal["", "disable", "prefer", "require", "verify-ca", "verify-full"] = ""
    sslrootcert_file: Path | None = None  # the CA that signed the server's certificate
    sslcert_file: Path | None = None  # client certificate, for servers that verify clients
    sslkey_file: Path | None = None
    password_file: Path | None = None  # the password alone, as a Secret mount gives it


class LedgerSettings(BaseModel):
    """TLS and credentials for a ClickHouse server ledger (`ledger_dsn` https://...)."""

    model_config = ConfigDict(extra="forbid")

    tls: TLSSettings = TLSSettings()
    password_file: Path | None = None
    # Embedded chDB only: once the consumer's resident memory (VmRSS) is over this many MB
    # it starts itself afresh between batches (same pid, exec; the group resumes from the
    # committed offsets): each time the engine is let go for a `sco ledger` reader it
    # leaks ~2.3 MB that nothing gives back. A fresh consumer's working set is 350-430 MB
    # (chDB's library ~235 MB resident, its engine ~150 MB), so the default leaves room
    # for ~40 readers between restarts (at 384, 15 restarts an hour and still over it at
    # each warm-up: bench/ledger_soak_bench.py). Never within its first minute. 0: off.
    recycle_rss_mb: int = Field(default=512, ge=0)


class ContractSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The control plane reads contracts from the same signed bundle nodes and admission
    # use (never from the source repository). Empty: under <data_dir>/contracts/.
    cache_dir: Path | None = None
    trust_dir: Path | None = None
    # The contract sources `sco dev up` compiles and signs (with a local key under
    # <data_dir>/contracts/keys) for the region in a box.
    source_dir: Path = Path("contracts/examples")
    # Contracts from git (`sco contracts sync`): the repository (any git URL: https://,
    # git://, ssh://, a path), then mirrors tried in order when it does not answer. Empty
    # repo_url: no sync (the box does not start one).
    repo_url: str = ""
    mirror_urls: list[str] = []
    ref: str = "main"
    path: str = "contracts"  # the folder of contract files inside the repository
    # The Ed25519 key (<key id>.key) the sync signs bundles with; its .pub must be in the
    # trust directory, beside `allowed_signers` (who may sign commits: ssh-keygen(1)).
    # Empty: the region in a box's local key (<data_dir>/contracts/keys).
    signing_key_file: Path | None = None
    # Directory of <region>/<key id>.pub notice keys compiled into each bundle (optional).
    notice_keys_dir: Path | None = None
    sync_interval_seconds: float = Field(default=30.0, gt=0)
    # The sync's local bare mirror of the repository. Empty: <data_dir>/contracts/git.
    mirror_dir: Path | None = None
    # Prometheus metrics (sco_contract_sync_*) and GET /healthz, /readyz; 0 turns each off.
    sync_metrics_port: int = Field(default=0, ge=0, le=65535)
    sync_health_port: int = Field(default=0, ge=0, le=65535)


class NoticeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The notice relay's Ed25519 key (<key id>.key, contracts/keys.py): every notice is
    # signed with it, and nodes accept it only when the bundle lists its .pub for the
    # region (`sco contracts compile --notice-keys`). `sco dev up` makes one for the box.
    # A relay re-reads its key file when it changes (or on SIGHUP): rotation, no restart.
    signing_key_file: Path | None = None
    # Per-hall relay keys: hall -> its relay's key file, used instead of signing_key_file
    # by that hall's relay (`sco keys relay-new`; the bundle's scopes.yaml says which hall
    # each key signs for, and nodes refuse a notice signed by another hall's key).
    hall_key_files: dict[str, Path] = {}

    def key_file(self, hall: str) -> tuple[Path | None, str]:
        """The key file `hall`'s relay signs with, and the settings key that names it."""
        if hall in self.hall_key_files:
            return self.hall_key_files[hall], f"notices.hall_key_files.{hall}"
        return self.signing_key_file, "notices.signing_key_file"


class ControlSettings(BaseModel):
    """The region controller, the acquisitions it starts, and the region's API budget."""

    model_config = ConfigDict(extra="forbid")

    # Contracts are hashed to a partition; one controller workflow per region x partition.
    partitions: int = Field(default=4, ge=1, le=64)
    tick_seconds: float = Field(default=60.0, gt=0)
    # A controller continues as new after this many ticks (sooner when Temporal suggests
    # it). The SDK's core holds each tick's plan input (the region's pools and contracts,
    # ~25 kB) for the whole run, so a run of 200 ticks grew the worker ~4 MB every half
    # hour for three hours (decision 0040). Applies to controllers started after it is set.
    ticks_per_run: int = Field(default=30, ge=1, le=10_000)
    # Reclaimable instances nobody has needed for this long are released.
    release_idle_seconds: float = Field(default=900.0, ge=0)
    # The region's provider API budget for mutating calls, shared by all acquisitions.
    budget_rate_per_second: float = Field(default=10.0, gt=0)
    budget_burst: int = Field(default=20, ge=1)
    # A fallback above a contract's spend authority waits this long for an operator.
    approval_timeout_seconds: float = Field(default=1800.0, gt=0)
    # Committed fallback capacity is reserved for this long (Blazar lease length).
    fallback_lease_hours: float = Field(default=24.0, gt=0)
    # A boot still in BUILD after this long is deleted and counted as a shortfall.
    build_timeout_seconds: float = Field(default=900.0, gt=0)
    # The region's reconciler compares provider and fleet state this often; provider-only
    # and fleet-only things younger than the grace are left alone.
    reconcile_interval_seconds: float = Field(default=300.0, gt=0)
    reconcile_grace_seconds: float = Field(default=900.0, ge=0)
    # Members of one spread group hold at most this share of their units in one pool.
    spread_max_pool_fraction: float = Field(default=0.25, gt=0, le=1)
    # Reclaim rates come from the ledger over this window.
    reclaim_window_hours: float = Field(default=168.0, gt=0)
    # The planner prices the owner's load too: a pool with nothing free is expected to be
    # reclaimed this many times per instance-hour, one with at least load_risk_free_share
    # free not at all (planning.models.LoadRisk; 0: off).
    load_risk_rate: float = Field(default=2.0, ge=0)
    # The free share of a pool at or above which the owner's load adds no risk.
    load_risk_free_share: float = Field(default=0.25, gt=0, le=1)
    # At most this many instances per acquisition workflow (a bigger need is split).
    max_instances_per_acquisition: int = Field(default=200, ge=1)


class LifecycleSettings(BaseModel):
    """The region's lifecycle workflow: voluntary replacements (drift, return from fallback,
    expiry), make-before-break, within each contract's disruption budget."""

    model_config = ConfigDict(extra="forbid")

    # The region worker starts the region's lifecycle workflow (idempotent) when on; off
    # leaves a running one alone (pause it: `sco lifecycle pause --region R`).
    enabled: bool = True
    # Seconds between rounds; a pause or resume starts one at once.
    interval_seconds: float = Field(default=300.0, gt=0)
    # Return from fallback only for fallback instances at least this old ...
    min_age_seconds: float = Field(default=3600.0, ge=0)
    # ... into pools that showed free capacity on this many rounds in a row (hysteresis) ...
    stable_rounds: int = Field(default=2, ge=1)
    # ... and saving at least this much per hour (the region's currency).
    min_saving_per_hour: float = Field(default=0.0, ge=0)
    # Consolidation (one or two reclaimable instances replaced by one that still covers
    # demand): on or off, and the least saving as a share of what the replaced cost.
    consolidate: bool = True
    consolidation_margin: float = Field(default=0.2, ge=0, le=1)
    # A consolidation waits until it has been found on this many rounds in a row (12: an
    # hour at the default interval): a dip in demand mostly comes back within it.
    consolidation_stable_rounds: int = Field(default=12, ge=1)
    # Return from fallback when no allowed pool has a free instance as large as the
    # fallback one: at most this many smaller reclaimable instances replace it (1: wait
    # for one as large).
    max_return_parts: int = Field(default=4, ge=1)
    # A hall where no notice relay answered a drain: its instances wait this long before
    # another replacement is booted for them.
    drain_retry_seconds: float = Field(default=1800.0, ge=0)


class WorkerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Prometheus metrics (Temporal runtime telemetry and SCO's counters); 0 turns them off.
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    # SCO's gauges and histograms of the region (floors, budget, acquisitions, exclusions:
    # prometheus_client, a collector reading fleet state and the keepers' queries every
    # `collect_seconds`); Temporal's runtime owns `metrics_port`. 0 turns it off.
    state_metrics_port: int = Field(default=9465, ge=0, le=65535)
    collect_seconds: float = Field(default=15.0, gt=0)
    # Liveness/readiness (GET /healthz, /readyz); 0 turns it off.
    health_port: int = Field(default=8080, ge=0, le=65535)
    graceful_shutdown_seconds: float = Field(default=20.0, ge=0)
    # Threads the controllers' exact plans (HiGHS) are solved on, apart from the activity
    # pool: HiGHS keeps about 1 MB for each thread that ever solved (decision 0040). Two
    # let four partitions' solves of one tick each have their whole budget
    # (control.exact_plan_seconds).
    solver_threads: int = Field(default=2, ge=1, le=64)
    # Start the region's controller partitions (idempotent) when the worker starts.
    start_controllers: bool = True
    # Temporal Worker Deployments (worker versioning). Off by default so the region in a
    # box and the tests run unversioned; the Kubernetes manifests turn it on. When on, the
    # worker polls as version <deployment_name>.<build_id>, and new workflows go to the
    # deployment's current version (set it after a rollout: deploy/README.md).
    versioning: bool = False
    # Empty: "sco-<region>".
    deployment_name: str = ""
    # Empty: the installed package version. Set it per image (SCO_WORKER__BUILD_ID).
    build_id: str = ""

    def deployment(self, region: str) -> str:
        return self.deployment_name or f"sco-{region}"

    def effective_build_id(self) -> str:
        if self.build_id:
            return self.build_id
        import importlib.metadata  # the worker only: ~1 MB a relay need not hold

        try:
            return importlib.metadata.version("sco")
        except importlib.metadata.PackageNotFoundError:
            return "unknown"


class LogSettings(BaseModel):
    """The log of every long-running process (contracts/logformat.py)."""

    model_config = ConfigDict(extra="forbid")

    # json: one object per line (ts, level, logger, message; workflow and activity ids on
    # the Temporal SDK's lines); text: one readable line; auto: text on a terminal, else json.
    format: LogFormat = "auto"
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class TracingSettings(BaseModel):
    """OpenTelemetry traces of workflows and activities (workers/tracing.py)."""

    model_config = ConfigDict(extra="forbid")

    # OTLP over HTTP, e.g. http://otel-collector:4318/v1/traces; empty turns tracing off.
    otlp_endpoint: str = ""
    # The `service.name` resource attribute; empty: sco-<process>, e.g. sco-worker.
    service_name: str = ""


#: Cloud-init for an instance behind a Slurm CLOUD node: it takes the node's name and
#: starts slurmd in configless mode against slurmctld. `{hostname}` is filled per instance by
#: the acquisition, `{slurmctld}` by the ResumeProgram from `slurm.slurmctld`.
DEFAULT_SLURM_USER_DATA = """\
#cloud-config
hostname: {hostname}
fqdn: {hostname}
write_files:
  - path: /etc/default/slurmd
    content: |
      SLURMD_OPTIONS="-N {hostname} --conf-server {slurmctld}"
runcmd:
  - [systemctl, enable, --now, munge]
  - [systemctl, enable, --now, slurmd]
"""


def _check_template(text: str, fields: tuple[str, ...]) -> str:
    """A user-data template may name only `fields` in braces (literal braces doubled)."""
    try:
        text.format(**{f: "" for f in fields})
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"template placeholders may only be {', '.join('{' + f + '}' for f in fields)} "
            f"(double literal braces): {exc!r}"
        ) from exc
    return text


class IntakeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # How often the region's DemandIntakeWorkflow reads the scheduler sources.
    interval_seconds: float = Field(default=15.0, gt=0)
    # A source unreadable this long has its demand dropped; until then its last is kept.
    stale_after_seconds: float = Field(default=1800.0, gt=0)


class SlurmSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The cluster's slurm.conf for scontrol/squeue (SLURM_CONF); None: Slurm's default.
    slurm_conf: Path | None = None
    # Where scontrol and squeue are; None: PATH.
    bin_dir: Path | None = None
    # Count pending jobs of contracts as demand (the intake's `slurm` source).
    pending_demand: bool = False
    # Only jobs of these partitions count; empty: all partitions.
    partitions: list[str] = []
    # Read pending jobs from slurmrestd instead of squeue: `http://host:6820` (JWT: set
    # rest_user and rest_token, e.g. SCO_SLURM__REST_TOKEN) or `unix:/path/slurmrestd.sock`.
    rest_url: str = ""
    rest_user: str = ""
    rest_token: SecretStr = SecretStr("")
    rest_token_file: Path | None = None  # the token alone; wins over rest_token
    rest_api_version: str = "v0.0.38"
    # slurmctld as slurmd --conf-server reaches it (host[:port]); fills `{slurmctld}`.
    slurmctld: str = "slurmctld"
    # Cloud-init for instances behind CLOUD nodes; `{hostname}` and `{slurmctld}` filled.
    user_data: str = DEFAULT_SLURM_USER_DATA
    # ACTIVE polls of a booting node, in seconds (the acquisition's poll interval).
    poll_seconds: float = Field(default=1.0, gt=0)
    # The power programs append one JSON line per call here; None: stdout only.
    log_file: Path | None = None

    @field_validator("user_data")
    @classmethod
    def _placeholders(cls, text: str) -> str:
        return _check_template(text, ("hostname", "slurmctld"))


#: Cloud-init for instances of contracts with Kubernetes selectors: kubelet joins with the
#: labels and taints naming the node's pool, hall and capacity type (`{kubelet_args}`, the
#: names the Kyverno policy and the agent use). How the node authenticates (a bootstrap
#: token, kubeadm join) is the site's image; set `kubernetes.node_user_data` to add it.
DEFAULT_KUBELET_USER_DATA = """\
#cloud-config
write_files:
  - path: /etc/default/kubelet
    content: |
      KUBELET_EXTRA_ARGS="{kubelet_args}"
runcmd:
  - [systemctl, enable, --now, kubelet]
"""


class KubernetesSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Count unschedulable pending pods of contracts as demand (the `kubernetes` source).
    pending_demand: bool = False
    # None: in-cluster config when running in a pod, else ~/.kube/config.
    kubeconfig: Path | None = None
    context: str | None = None
    # Only these namespaces are listed; empty: every namespace (needs cluster-wide list).
    namespaces: list[str] = []
    # Cloud-init for instances of contracts with Kubernetes selectors; `{kubelet_args}`
    # is filled per instance. Empty: the instances get no user-data.
    node_user_data: str = DEFAULT_KUBELET_USER_DATA

    @field_validator("node_user_data")
    @classmethod
    def _placeholders(cls, text: str) -> str:
        return _check_template(text, ("kubelet_args",))


class EstateRegionSettings(BaseModel):
    """Where `sco estate status` reads one region, when not where this process's settings
    point (production: each region has its own fleet database and Temporal)."""

    model_config = ConfigDict(extra="forbid")

    postgres_dsn: str | None = None
    temporal_address: str | None = None


class ConsoleSettings(BaseModel):
    """`sco console` over TLS. With `client_ca_file` only an operator whose client
    certificate that CA signed gets a page (the identities of the rest of SCO's operator
    endpoints); without these files it serves plain HTTP, for loopback or behind a TLS
    front that checks the certificates itself."""

    model_config = ConfigDict(extra="forbid")

    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None

    @model_validator(mode="after")
    def _together(self) -> ConsoleSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("console.cert_file and console.key_file go together")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError(
                "console.client_ca_file needs console.cert_file: clients are checked only over TLS"
            )
        return self


class OpenBaoSettings(BaseModel):
    """OpenBao: certificates with SPIFFE IDs and the region's secrets (workers/openbao/).
    The box runs a server of its own on `address` (TLS with a CA it makes, storage, unseal
    key and root token under <data_dir>/openbao); production names the site's server and
    the files its auth method gives the process (deploy/openbao/README.md)."""

    model_config = ConfigDict(extra="forbid")

    # https://host:port; the box also takes port+1 for the server's cluster listener.
    address: str = "https://127.0.0.1:8200"
    # None: the box's own CA (<data_dir>/openbao/tls/ca.pem) for an https address.
    ca_file: Path | None = None
    # The token alone; None: the box's initial root token, under <data_dir>/openbao/secrets.
    token_file: Path | None = None
    # `sco dev up` starts, unseals and provisions the box's own server; false: leave it out.
    box: bool = True

    @field_validator("address")
    @classmethod
    def _http_url(cls, value: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
        ):
            raise ValueError(f"{value!r}: not an http(s)://host:port address")
        return value.rstrip("/")


class IdentitySettings(BaseModel):
    """This process's own certificate (its SPIFFE ID), renewed while it runs
    (contracts/cert_renewal.py). `files`: the certificate files the TLS settings name are
    kept current by someone else (cert-manager, an OpenBao Agent) and read when a client
    is made. `openbao`: the process issues its own from OpenBao's role for `kind` (token:
    `openbao.token_file`), writes it to `cert_file`/`key_file` (the files its TLS settings
    name) and reloads its clients at `renew_fraction` of each certificate's lifetime."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["files", "openbao"] = "files"
    # The process kind whose OpenBao role issues it: worker, notice-relay/<hall>, ...
    kind: str = ""
    cert_file: Path | None = None
    key_file: Path | None = None
    # Lifetime asked of OpenBao (its role caps it: 60 s to 24 h).
    ttl_seconds: int = Field(default=3600, ge=60, le=86400)
    # Renew when this fraction of the lifetime has passed (the rest is left for retries).
    renew_fraction: float = Field(default=2 / 3, ge=0.1, le=0.95)

    @model_validator(mode="after")
    def _openbao_needs_files(self) -> IdentitySettings:
        if self.source == "openbao" and not (self.kind and self.cert_file and self.key_file):
            raise ValueError("source openbao needs kind, cert_file and key_file")
        return self


class EstateSettings(BaseModel):
    """`sco estate status`: every region read at once, each within its own deadline."""

    model_config = ConfigDict(extra="forbid")

    # A region that has not answered within this is shown as not answering; the rest print.
    deadline_seconds: float = Field(default=5.0, gt=0)
    # Per region overrides: {"r2": {"postgres_dsn": "...", "temporal_address": "..."}}.
    regions: dict[str, EstateRegionSettings] = {}


class Settings(BaseModel):
    """`Settings(**overrides)` reads the sources (module docstring) under the overrides;
    `Settings.model_validate(data)` validates `data` alone."""

    model_config = ConfigDict(extra="forbid")

    def __init__(self, **overrides: Any) -> None:
        super().__init__(**_sources(overrides))

    region: str = "r1"
    regions: list[str] = ["r1", "r2", "r3"]
    regions_dir: Path = Path("deploy/regions")
    data_dir: Path = Path(".sco")
    postgres_dsn: str = "postgresql://postgres@127.0.0.1:5432/sco"
    fleet_db: FleetDbSettings = FleetDbSettings()
    nats_url: str = "nats://127.0.0.1:4222"
    nats_tls: TLSSettings = TLSSettings()
    nats_auth: NatsAuthSettings = NatsAuthSettings()
    postgres: PostgresSettings = PostgresSettings()
    # Empty means "<data_dir>/ledger" on the embedded chDB backend.
    ledger_dsn: str = ""
    ledger: LedgerSettings = LedgerSettings()
    # Prometheus metrics of the ledger consumer (sco_ledger_*, sco_dead_letters_total) and
    # its GET /healthz, /readyz (503 while Kafka or the ledger fails it); 0 turns each off.
    ledger_metrics_port: int = Field(default=0, ge=0, le=65535)
    ledger_health_port: int = Field(default=0, ge=0, le=65535)
    # The same for the drain intake (`sco ledger book-drains`: sco_drain_reports_*; ready
    # while NATS answers and its last step went through).
    drain_intake_metrics_port: int = Field(default=0, ge=0, le=65535)
    drain_intake_health_port: int = Field(default=0, ge=0, le=65535)
    temporal: TemporalSettings = TemporalSettings()
    kafka: KafkaSettings = KafkaSettings()
    outbox: OutboxSettings = OutboxSettings()
    notice_relay: NoticeRelaySettings = NoticeRelaySettings()
    prometheus: PrometheusSettings = PrometheusSettings()
    provider: ProviderSettings = ProviderSettings()
    contracts: ContractSettings = ContractSettings()
    notices: NoticeSettings = NoticeSettings()
    control: ControlSettings = ControlSettings()
    worker: WorkerSettings = WorkerSettings()
    log: LogSettings = LogSettings()
    tracing: TracingSettings = TracingSettings()
    intake: IntakeSettings = IntakeSettings()
    lifecycle: LifecycleSettings = LifecycleSettings()
    slurm: SlurmSettings = SlurmSettings()
    kubernetes: KubernetesSettings = KubernetesSettings()
    estate: EstateSettings = EstateSettings()
    console: ConsoleSettings = ConsoleSettings()
    openbao: OpenBaoSettings = OpenBaoSettings()
    identity: IdentitySettings = IdentitySettings()
    box: BoxSettings = BoxSettings()

    @model_validator(mode="after")
    def _nats_user_has_a_credential(self) -> Settings:
        a = self.nats_auth
        if a.user and a.password_file is None and self.nats_tls.client_cert_file is None:
            raise ValueError(
                "nats_auth.user needs nats_auth.password_file or a client certificate "
                "(nats_tls.client_cert_file) that maps to it"
            )
        return self

    @model_validator(mode="after")
    def _budget_within_provider_limit(self) -> Settings:
        c, p = self.control, self.provider
        if c.budget_rate_per_second > p.api_rate_limit_per_second:
            raise ValueError(
                f"control.budget_rate_per_second {c.budget_rate_per_second:g} is above "
                f"provider.api_rate_limit_per_second {p.api_rate_limit_per_second:g}"
            )
        if c.budget_burst > p.api_burst_limit:
            raise ValueError(
                f"control.budget_burst {c.budget_burst} is above provider.api_burst_limit "
                f"{p.api_burst_limit}"
            )
        return self

    @property
    def bundle_cache_dir(self) -> Path:
        return self.contracts.cache_dir or self.data_dir / "contracts" / "cache"

    @property
    def trust_dir(self) -> Path:
        return self.contracts.trust_dir or self.data_dir / "contracts" / "trust"

    @property
    def effective_ledger_dsn(self) -> str:
        return self.ledger_dsn or f"chdb://{(self.data_dir / 'ledger').resolve()}"

    def __repr_args__(self) -> Any:
        # A DSN may carry a password (postgresql://u:pw@h/db); repr and logs never show it.
        for name, value in super().__repr_args__():
            yield name, _masked(value)

    @model_serializer(mode="wrap")
    def _mask_on_dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        # model_dump()/model_dump_json() are printed too (`sco dev status`, support bundles):
        # every string in them, DSNs and URLs at any depth, has its credentials masked.
        return _masked(handler(self))

    def region_file(self, region: str | None = None) -> Path:
        return self.regions_dir / f"{region or self.region}.toml"


def _masked(value: Any) -> Any:
    """`value` with `mask_credentials` applied to every string in it (nested models too)."""
    if isinstance(value, str):
        return mask_credentials(value)
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_masked(v) for v in value)
    if isinstance(value, BaseModel):
        return value.model_copy(
            update={k: _masked(v) for k, v in value if isinstance(v, str | list | BaseModel)}
        )
    return value


class SettingsError(ValueError):
    """Settings could not be loaded; the message names the source, field and reason."""


def _sources(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The TOML file's values, under the `SCO_*` environment's, under `overrides`."""
    path = config_file()
    data: dict[str, Any] = {}
    if path.is_file():
        with path.open("rb") as f:
            data = tomllib.load(f)  # TOMLDecodeError (a ValueError): load_settings names it
    return _merged(_merged(data, _environment(os.environ)), dict(overrides))


def _merged(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `top` over it; tables (dicts) in both are merged, key by key."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def _environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings `SCO_*` variables give (names case-insensitive, as pydantic-settings
    reads them): `SCO_<FIELD>` for a top-level field (JSON for a list, table or section),
    and for a section or table field `SCO_<FIELD>__<KEY>[__<KEY>...]` into it. Variables
    naming no field (SCO_CONFIG, a tool's SCO_PYTHON) are not settings."""
    prefix = ENV_PREFIX.lower()
    env = {k.lower(): v for k, v in environ.items() if k.lower().startswith(prefix)}
    out: dict[str, Any] = {}
    for name, field in Settings.model_fields.items():
        key = prefix + name
        complex_ = _is_complex(field.annotation)
        value: Any = env.get(key)
        if not complex_:
            if value is not None:
                out[name] = value
            continue
        if value is not None:
            value = _json(key, value, allow_failure=_is_union(field.annotation))
            if not isinstance(value, dict):
                out[name] = value
                continue
        nested = _exploded(key + ENV_NESTED_DELIMITER, field.annotation, env)
        if value is not None:
            out[name] = _merged(value, nested)
        elif nested:
            out[name] = nested
    return out


def _exploded(prefix: str, annotation: Any, env: Mapping[str, str]) -> dict[str, Any]:
    """`<prefix>a__b=v` as {"a": {"b": v}}; v decoded from JSON where b is a list or table."""
    result: dict[str, Any] = {}
    for name, raw in env.items():
        if not name.startswith(prefix):
            continue
        *keys, last = name[len(prefix) :].split(ENV_NESTED_DELIMITER)
        target, node = annotation, result
        for key in keys:
            target = _member(target, key)
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            in_table = _is_dict(target)
            target = _member(target, last)
            value: Any = raw
            if raw and (in_table or (target is not None and _is_complex(target))):
                # A table's values may be plain strings: JSON only when it parses.
                value = _json(name.upper(), raw, allow_failure=in_table or _is_union(target))
            node[last] = value
    return result


def _member(annotation: Any, key: str) -> Any:
    """The type of `key` inside `annotation` (a section's field, a table's values)."""
    for option in _options(annotation):
        if isinstance(option, type) and issubclass(option, BaseModel):
            for fname, field in option.model_fields.items():
                if fname.lower() == key:
                    return field.annotation
        elif _is_dict(option):
            args = get_args(option)
            return args[1] if len(args) == 2 else None
    return None


def _options(annotation: Any) -> tuple[Any, ...]:
    return get_args(annotation) if _is_union(annotation) else (annotation,)


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def _is_dict(annotation: Any) -> bool:
    return any(option is dict or get_origin(option) is dict for option in _options(annotation))


def _is_complex(annotation: Any) -> bool:
    """A section, list, set, tuple or table: read from the environment as JSON."""
    for option in _options(annotation):
        origin = get_origin(option) or option
        if isinstance(origin, type) and (
            issubclass(origin, BaseModel | list | set | frozenset | tuple | dict)
        ):
            return True
    return False


def _json(name: str, raw: str, allow_failure: bool) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        if allow_failure:
            return raw
        raise SettingsError(f"environment {name.upper()}: not valid JSON ({exc})") from None


def config_file() -> Path:
    return Path(os.environ.get(CONFIG_ENV, str(DEFAULT_CONFIG_FILE)))


def load_settings(**overrides: Any) -> Settings:
    path = config_file()
    if CONFIG_ENV in os.environ and not path.is_file():
        raise SettingsError(f"{path}: {CONFIG_ENV} names a file that does not exist")
    try:
        return Settings(**overrides)
    except SettingsError:
        raise
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "(root)"
            lines.append(f"{path} or SCO_* environment: {field}: {err['msg']}")
        raise SettingsError("\n".join(lines)) from exc
    except ValueError as exc:  # TOML syntax errors surface as ValueError subclasses
        raise SettingsError(f"{path}: {exc}") from exc
