"""The agent's configuration: one TOML file, every key overridable by `SCO_AGENT_<KEY>`.

Keys (all top level):
    node_id                 this node's name in the scheduler and in notices (default: hostname)
    region, hall            where the node is; they pick the notice subject
    scheduler               slurm | kubernetes | none
    nats_urls               list of NATS servers (env: comma separated)
    cache_dir, trust_dir    the contract bundle cache and the trust directory
    journal_path            JSON-lines journal of drains; the dedupe store sits beside it
    socket_dir              where workloads' checkpoint sockets live: one directory per job,
                            made by the agent for the job's user (agent/checkpoint/jobdirs.py)
    job_dir_refresh_seconds how often the agent makes and removes those directories as jobs
                            come and go (slurm and kubernetes schedulers)
    slurm_cgroup_check      a job's socket must be served from the job's cgroup (Slurm with
                            proctrack/cgroup); false where Slurm tracks jobs without cgroups
    metadata_path           optional JSON file polled for notices: the local fallback
                            (must be owned by metadata_owner_uid, root, and not group/world
                            writable; deadlines within notice_lead_seconds + margin)
    metadata_owner_uid      the uid that must own metadata_path (default 0: root)
    dry_run                 log every mutating call instead of making it
    safety_margin_seconds   a drain's waits end this long before the notice's deadline
    notice_deadline_margin_seconds  the clock skew bound: allowed past the region's notice
                            lead, and between a notice's issued_at and the node's clock
    notice_keys_dir         the relays' public keys shipped with the install (<key id>.pub,
                            revoked.txt): notices verify from first boot, before any bundle,
                            and when the bundle lists none for the region
    notice_lead_seconds     the region's notice lead when no trusted bundle gives it
    bundle_max_age_hours    a bundle older than this is no longer trusted for notices (its
                            notice keys ignored, loudly; its contracts still drive drains)
    require_time_sync       refuse to start unless the kernel says NTP synchronised the
                            clock or the offset measured against NATS is within the bound
    clock_check_seconds     how often the clock offset is measured against NATS
    nats_user, nats_password_file   NATS user and a file holding its password, or
    nats_creds_file                 a NATS credentials (JWT + nkey) file, or
    nats_nkey_seed_file             an nkey seed file
    nats_tls_ca, nats_tls_cert, nats_tls_key   TLS to NATS: CA bundle, client cert and key
    tls_reload_seconds   how often a renewed nats_tls_cert is looked for (reloaded in place)
    bundle_first_retry_seconds  how often a node without a bundle asks the distributor
    workers, report_timeout_seconds, metadata_poll_seconds, bundle_refresh_seconds,
    kubernetes_api_url, kubernetes_token_path, kubernetes_ca_path

A bad file raises ConfigError naming the file, the field and the reason.
"""

from __future__ import annotations

import os
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

ENV_PREFIX = "SCO_AGENT_"
DEFAULT_PATH = Path("/etc/sco-agent/agent.toml")


class ConfigError(ValueError):
    """The configuration cannot be used; str() names file, field and reason."""

    def __init__(self, source: str, field: str, reason: str) -> None:
        super().__init__(f"{source}: {field}: {reason}")
        self.source = source
        self.field = field
        self.reason = reason


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node_id: str = Field(default_factory=lambda: socket.gethostname().split(".")[0])
    region: str
    hall: str
    scheduler: Literal["slurm", "kubernetes", "none"] = "slurm"
    nats_urls: list[str] = ["nats://127.0.0.1:4222"]
    cache_dir: Path = Path("/var/lib/sco-agent/bundle")
    trust_dir: Path = Path("/etc/sco-agent/trust")
    journal_path: Path = Path("/var/lib/sco-agent/journal.jsonl")
    socket_dir: Path = Path("/run/sco-agent/checkpoint")
    job_dir_refresh_seconds: float = Field(default=5.0, gt=0)
    slurm_cgroup_check: bool = True
    metadata_path: Path | None = None
    # Prometheus textfile (node_exporter's textfile collector directory, `*.prom`) with
    # notices received/refused, drain durations by outcome, workloads told/forced.
    metrics_textfile: Path | None = None
    dry_run: bool = False
    safety_margin_seconds: float = Field(default=5.0, ge=0)
    workers: int = Field(default=2, ge=1, le=16)
    report_timeout_seconds: float = Field(default=2.0, gt=0)
    metadata_poll_seconds: float = Field(default=1.0, gt=0)
    bundle_refresh_seconds: float = Field(default=60.0, gt=0)
    # While the node holds no bundle (a fresh node), it asks the distributor this often.
    bundle_first_retry_seconds: float = Field(default=5.0, gt=0)
    kubernetes_api_url: str = "https://kubernetes.default.svc"
    kubernetes_token_path: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    kubernetes_ca_path: Path | None = None
    notice_deadline_margin_seconds: float = Field(default=30.0, ge=0, le=3600)
    notice_keys_dir: Path | None = None
    notice_lead_seconds: int = Field(default=120, gt=0, le=86400)
    bundle_max_age_hours: float = Field(default=168.0, gt=0)
    require_time_sync: bool = False
    clock_check_seconds: float = Field(default=60.0, gt=0)
    metadata_owner_uid: int = Field(default=0, ge=0)
    nats_user: str | None = None
    nats_password_file: Path | None = None
    nats_creds_file: Path | None = None
    nats_nkey_seed_file: Path | None = None
    nats_tls_ca: Path | None = None
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    # How often the agent looks for a renewed nats_tls_cert (reloaded without a restart).
    tls_reload_seconds: float = Field(default=10.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _nats_auth(self) -> AgentConfig:
        ways = [
            name
            for name, on in (
                ("nats_user", self.nats_user is not None),
                ("nats_creds_file", self.nats_creds_file is not None),
                ("nats_nkey_seed_file", self.nats_nkey_seed_file is not None),
            )
            if on
        ]
        if len(ways) > 1:
            raise ValueError(f"set one NATS identity, not {' and '.join(ways)}")
        if (self.nats_user is None) != (self.nats_password_file is None):
            raise ValueError("nats_user and nats_password_file go together")
        if (self.nats_tls_cert is None) != (self.nats_tls_key is None):
            raise ValueError("nats_tls_cert and nats_tls_key go together")
        return self

    @field_validator("node_id", "region", "hall")
    @classmethod
    def _subject_token(cls, value: str) -> str:
        if not value or not all(ch.isalnum() or ch in "-_" for ch in value):
            raise ValueError("must be letters, digits, '-' or '_' (it is a NATS subject token)")
        return value

    @field_validator("nats_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [u.strip() for u in value.split(",") if u.strip()]
        return value

    @property
    def dedupe_path(self) -> Path:
        return self.journal_path.with_name(self.journal_path.stem + ".seen.json")


def load_config(path: Path | None, env: Mapping[str, str] | None = None) -> AgentConfig:
    """The file's values, then `SCO_AGENT_*` overrides; ConfigError when unusable."""
    env = os.environ if env is None else env
    source = str(path) if path is not None else "(no config file)"
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(source, "-", "file does not exist") from None
        except OSError as exc:
            raise ConfigError(source, "-", f"cannot read: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(source, "-", f"not valid TOML: {exc}") from exc
    overridden: set[str] = set()
    for name in AgentConfig.model_fields:
        key = ENV_PREFIX + name.upper()
        if key in env:
            data[name] = env[key]
            overridden.add(name)
    try:
        # Env values are strings: let pydantic coerce them ("true", "5", paths).
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "-"
        where = f"{source} (env {ENV_PREFIX}{field.upper()})" if field in overridden else source
        if err["type"] == "extra_forbidden":
            raise ConfigError(where, field, "unknown key") from exc
        raise ConfigError(where, field, err["msg"]) from exc
