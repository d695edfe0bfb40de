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

A frozen dataclass read by `_coerce`, not a pydantic model: the agent imports no pydantic
(decision 0041). Values are taken as TOML gives them and as environment strings ("true",
"5", "a, b" for a list, a path); bounds are each field's `metadata`.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

ENV_PREFIX = "SCO_AGENT_"
DEFAULT_PATH = Path("/etc/sco-agent/agent.toml")
#: Where a config built from a mapping (not a file) is said to come from.
NO_FILE = "(no config file)"


class ConfigError(ValueError):
    """The configuration cannot be used; str() names file, field and reason."""

    def __init__(self, source: str, field: str, reason: str) -> None:
        super().__init__(f"{source}: {field}: {reason}")
        self.source = source
        self.field = field
        self.reason = reason


def _bounded(
    default: Any, *, gt: float | None = None, ge: float | None = None, le: float | None = None
) -> Any:
    return field(default=default, metadata={"gt": gt, "ge": ge, "le": le})


def _hostname() -> str:
    return socket.gethostname().split(".")[0]


@dataclass(frozen=True)
class AgentConfig:
    region: str
    hall: str
    node_id: str = field(default_factory=_hostname)
    scheduler: Literal["slurm", "kubernetes", "none"] = "slurm"
    nats_urls: list[str] = field(default_factory=lambda: ["nats://127.0.0.1:4222"])
    cache_dir: Path = Path("/var/lib/sco-agent/bundle")
    trust_dir: Path = Path("/etc/sco-agent/trust")
    journal_path: Path = Path("/var/lib/sco-agent/journal.jsonl")
    socket_dir: Path = Path("/run/sco-agent/checkpoint")
    job_dir_refresh_seconds: float = _bounded(5.0, gt=0)
    slurm_cgroup_check: bool = True
    metadata_path: Path | None = None
    # Prometheus textfile (node_exporter's textfile collector directory, `*.prom`) with
    # notices received/refused, drain durations by outcome, workloads told/forced.
    metrics_textfile: Path | None = None
    dry_run: bool = False
    safety_margin_seconds: float = _bounded(5.0, ge=0)
    workers: int = _bounded(2, ge=1, le=16)
    report_timeout_seconds: float = _bounded(2.0, gt=0)
    metadata_poll_seconds: float = _bounded(1.0, gt=0)
    bundle_refresh_seconds: float = _bounded(60.0, gt=0)
    # While the node holds no bundle (a fresh node), it asks the distributor this often.
    bundle_first_retry_seconds: float = _bounded(5.0, gt=0)
    kubernetes_api_url: str = "https://kubernetes.default.svc"
    kubernetes_token_path: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    kubernetes_ca_path: Path | None = None
    notice_deadline_margin_seconds: float = _bounded(30.0, ge=0, le=3600)
    notice_keys_dir: Path | None = None
    notice_lead_seconds: int = _bounded(120, gt=0, le=86400)
    bundle_max_age_hours: float = _bounded(168.0, gt=0)
    require_time_sync: bool = False
    clock_check_seconds: float = _bounded(60.0, gt=0)
    metadata_owner_uid: int = _bounded(0, ge=0)
    nats_user: str | None = None
    nats_password_file: Path | None = None
    nats_creds_file: Path | None = None
    nats_nkey_seed_file: Path | None = None
    nats_tls_ca: Path | None = None
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    # How often the agent looks for a renewed nats_tls_cert (reloaded without a restart).
    tls_reload_seconds: float = _bounded(10.0, gt=0, le=3600)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = NO_FILE) -> AgentConfig:
        """Every key checked and coerced, then the rules across keys; ConfigError for the
        first that is wrong (an unknown key included)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name in data:
            if name not in fields:
                raise ConfigError(source, str(name), "unknown key")
        values: dict[str, Any] = {}
        for name, f in fields.items():
            if name in data:
                try:
                    values[name] = _coerce(data[name], str(f.type), f.metadata)
                except ValueError as exc:
                    raise ConfigError(source, name, str(exc)) from None
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(source, name, "field required")
        config = cls(**values)
        for name in ("node_id", "region", "hall"):
            value = getattr(config, name)
            if not value or not all(ch.isalnum() or ch in "-_" for ch in value):
                raise ConfigError(
                    source, name, "must be letters, digits, '-' or '_' (it is a NATS subject token)"
                )
        problem = config._nats_auth()
        if problem:
            raise ConfigError(source, "-", problem)
        return config

    def _nats_auth(self) -> str:
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
            return f"set one NATS identity, not {' and '.join(ways)}"
        if (self.nats_user is None) != (self.nats_password_file is None):
            return "nats_user and nats_password_file go together"
        if (self.nats_tls_cert is None) != (self.nats_tls_key is None):
            return "nats_tls_cert and nats_tls_key go together"
        return ""

    def replace(self, **changes: Any) -> AgentConfig:
        return dataclasses.replace(self, **changes)

    @property
    def dedupe_path(self) -> Path:
        return self.journal_path.with_name(self.journal_path.stem + ".seen.json")


_TRUE = {"true", "1", "yes", "on", "t", "y"}
_FALSE = {"false", "0", "no", "off", "f", "n"}


def _coerce(value: Any, kind: str, bounds: Mapping[str, float | None]) -> Any:
    """`value` (from TOML, or an environment string) as a field of type `kind`."""
    if kind.endswith(" | None"):
        return None if value is None else _coerce(value, kind.removesuffix(" | None"), bounds)
    if kind.startswith("Literal["):
        options = [o.strip().strip("\"'") for o in kind[len("Literal[") : -1].split(",")]
        if value not in options:
            raise ValueError(
                f"expected one of {', '.join(repr(o) for o in options)}, got {value!r}"
            )
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {type(value).__name__}")
        return value
    if kind == "Path":
        if not isinstance(value, str | Path) or not str(value):
            raise ValueError("expected a path")
        return Path(value)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise ValueError(f"expected true or false, got {value!r}")
    if kind == "list[str]":
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError("expected a list of strings")
        return value
    if kind in ("int", "float"):
        return _number(value, int if kind == "int" else float, bounds)
    raise ValueError(f"no reader for a {kind}")  # a field of a new type needs one here


def _number(value: Any, kind: type[int] | type[float], bounds: Mapping[str, float | None]) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    try:
        number = kind(value.strip()) if isinstance(value, str) else value
        if kind is int and number != int(number):
            raise ValueError
        number = kind(number)
    except (ValueError, OverflowError):
        raise ValueError(
            f"expected {'an integer' if kind is int else 'a number'}, got {value!r}"
        ) from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ValueError(f"expected a finite number, got {value!r}")
    gt, ge, le = bounds.get("gt"), bounds.get("ge"), bounds.get("le")
    if gt is not None and not number > gt:
        raise ValueError(f"must be greater than {gt:g}, got {number}")
    if ge is not None and not number >= ge:
        raise ValueError(f"must be at least {ge:g}, got {number}")
    if le is not None and not number <= le:
        raise ValueError(f"must be at most {le:g}, got {number}")
    return number


def load_config(path: Path | None, env: Mapping[str, str] | None = None) -> AgentConfig:
    """The file's values, then `SCO_AGENT_*` overrides; ConfigError when unusable."""
    env = os.environ if env is None else env
    source = str(path) if path is not None else NO_FILE
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
        except UnicodeDecodeError as exc:
            raise ConfigError(source, "-", f"not UTF-8 text: {exc.reason}") from exc
    overridden: set[str] = set()
    for f in dataclasses.fields(AgentConfig):
        key = ENV_PREFIX + f.name.upper()
        if key in env:
            data[f.name] = env[key]
            overridden.add(f.name)
    try:
        return AgentConfig.from_mapping(data, source)
    except ConfigError as exc:
        if exc.field in overridden:
            where = f"{source} (env {ENV_PREFIX}{exc.field.upper()})"
            raise ConfigError(where, exc.field, exc.reason) from None
        raise
