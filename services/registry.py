"""Every long-running SCO process, once: what runs it, the `sco` command that starts it, the
settings it reads and the ports it serves.

The CLI's process commands find their `run` here, the region in a box starts what is listed
here on the ports listed here (and its Prometheus scrapes them under the jobs named here),
and the Kubernetes manifests are tested against it (tests/deploy/test_k8s_manifests.py).
A new process is one package under `services/` and one entry below.

Kept free of the services' own imports: `run` is a `module:function` reference, loaded
only by the command that starts the process (`sco --help` and the box load none of them).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from workers.settings import Settings


@dataclass(frozen=True)
class Port:
    """One port a process serves, set in `Settings` at `setting` (a dotted path)."""

    name: str  # the container port's name in deploy/k8s ("metrics", "health", ...)
    setting: str  # "worker.metrics_port", "ledger_health_port"
    #: The Prometheus job that scrapes it (`sco-<service>` plus this); None: not scraped
    #: (the health endpoint).
    job_suffix: str | None = ""

    @property
    def env(self) -> str:
        """The environment variable that sets it: SCO_WORKER__METRICS_PORT."""
        return "SCO_" + self.setting.upper().replace(".", "__")

    @property
    def scraped(self) -> bool:
        return self.job_suffix is not None

    def value(self, settings: Settings) -> int:
        obj: Any = settings
        for part in self.setting.split("."):
            obj = getattr(obj, part)
        return int(obj)


@dataclass(frozen=True)
class Kubernetes:
    """Where deploy/k8s runs the process: the Deployments whose pods carry
    `app.kubernetes.io/name: <app>`, in the container named `container`."""

    app: str
    container: str


@dataclass(frozen=True)
class Service:
    name: str  # "notice-relay": Prometheus jobs are `sco-<name>`
    run: str  # "package.module:function", the process's `run(settings, ...)`
    cli: tuple[str, ...]  # the `sco` command that starts it (before its options)
    settings_key: str | None  # the `Settings` section it reads (None: top-level fields)
    ports: tuple[Port, ...]  # metrics ports first, then health (the box hands them out so)
    #: How many the region in a box starts and with which options: one per hall
    #: (`--region R --hall H`), one per region (`--region R`), or one without options.
    per: Literal["hall", "region", "box"] = "region"
    box_name: str = ""  # the box's name for it: "{region}" and "{hall}" filled in
    kubernetes: Kubernetes | None = None  # None: not deployed on Kubernetes
    #: Started by the box only when this holds (the simulated cloud: no OpenStack).
    box_when: Callable[[Settings], bool] = lambda _s: True

    @property
    def job(self) -> str:
        return f"sco-{self.name}"

    def load(self) -> Callable[..., Any]:
        """The `run` function (imports the service's package). The process is a long-running
        one from here: it logs at `log.level`, not a command's WARNING."""
        from workers.logs import serving

        serving()
        module, attr = self.run.split(":")
        fn: Callable[..., Any] = getattr(importlib.import_module(module), attr)
        _give_back_freed_memory()

        @functools.wraps(fn)
        def with_identity(settings: Settings, *args: Any, **kwargs: Any) -> Any:
            # Its certificate current and renewed while it runs (identity.source).
            from workers import cert_renewal

            cert_renewal.start(settings)
            if _traced():  # SIGUSR2 writes a snapshot (workers/memory_trace.py)
                from workers import memory_trace

                memory_trace.arm(self.name, settings.data_dir / "diagnostics")
            return fn(settings, *args, **kwargs)

        return with_identity

    def argv(self, region: str, hall: str | None = None) -> list[str]:
        """The `sco` arguments the box starts it with."""
        if self.per == "hall":
            assert hall is not None
            return [*self.cli, "--region", region, "--hall", hall]
        if self.per == "region":
            return [*self.cli, "--region", region]
        return list(self.cli)

    def jobs(self) -> dict[str, str]:
        """Port name → the Prometheus job that scrapes it."""
        return {p.name: self.job + p.job_suffix for p in self.ports if p.job_suffix is not None}


def _traced() -> bool:
    """Started with Python's own switch for tracing (PYTHONTRACEMALLOC, -X tracemalloc).
    Asked without importing tracemalloc: with pickle it is 0.7 MB in every process that is
    not traced (a notice relay's is measured against 50 MB)."""
    return bool(os.environ.get("PYTHONTRACEMALLOC")) or "tracemalloc" in sys._xoptions


def _give_back_freed_memory() -> None:
    """What the imports (and the settings read before them) allocated and freed goes back to
    the operating system before the process starts its work: the cycles collected, then
    glibc's free heap pages released (malloc_trim; ~0.6 MB of a notice relay's resident
    memory, decision 0035). Elsewhere than glibc nothing is trimmed."""
    import ctypes
    import gc

    gc.collect()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


SERVICES: tuple[Service, ...] = (
    Service(
        name="simulator",
        run="services.simulator.service:run",
        cli=("sim", "serve"),
        settings_key="provider",
        ports=(
            Port("metrics", "provider.simulator_metrics_port"),
            Port("health", "provider.simulator_health_port", None),
        ),
        box_name="sim-{region}",
        box_when=lambda s: s.provider.kind == "simulator",
    ),
    Service(
        name="worker",
        run="services.region_worker.service:run",
        cli=("worker",),
        settings_key="worker",
        ports=(
            Port("state-metrics", "worker.state_metrics_port"),
            Port("metrics", "worker.metrics_port", "-runtime"),  # Temporal's runtime
            Port("health", "worker.health_port", None),
        ),
        box_name="worker-{region}",
        kubernetes=Kubernetes("sco-worker", "worker"),
    ),
    Service(
        name="notice-relay",
        run="services.notice_relay.service:run",
        cli=("notice-relay",),
        settings_key="notice_relay",
        ports=(
            Port("metrics", "notice_relay.metrics_port"),
            Port("health", "notice_relay.health_port", None),
        ),
        per="hall",
        box_name="notice-relay-{region}-{hall}",
        kubernetes=Kubernetes("sco-notice-relay", "sco-notice-relay"),
    ),
    Service(
        name="outbox-relay",
        run="services.outbox_relay.service:run",
        cli=("outbox", "relay"),
        settings_key="outbox",
        ports=(
            Port("metrics", "outbox.metrics_port"),
            Port("health", "outbox.health_port", None),
        ),
        per="box",
        box_name="relay-{region}",
        kubernetes=Kubernetes("sco-outbox-relay", "sco-outbox-relay"),
    ),
    Service(
        name="ledger-consumer",
        run="services.ledger_consumer.service:run",
        cli=("ledger", "consume"),
        settings_key="ledger",
        ports=(
            Port("metrics", "ledger_metrics_port"),
            Port("health", "ledger_health_port", None),
        ),
        per="box",
        box_name="ledger-consumer",
        kubernetes=Kubernetes("sco-ledger-consumer", "sco-ledger-consumer"),
    ),
    Service(
        name="drain-intake",
        run="services.drain_intake.service:run",
        cli=("ledger", "book-drains"),
        settings_key=None,
        ports=(
            Port("intake-metrics", "drain_intake_metrics_port"),
            Port("intake-health", "drain_intake_health_port", None),
        ),
        box_name="drain-intake-{region}",
        # The ledger consumer's pod's second process.
        kubernetes=Kubernetes("sco-ledger-consumer", "sco-drain-intake"),
    ),
    Service(
        name="contract-sync",
        run="services.contract_sync.service:run",
        cli=("contracts", "sync"),
        settings_key="contracts",
        ports=(
            Port("metrics", "contracts.sync_metrics_port"),
            Port("health", "contracts.sync_health_port", None),
        ),
        box_name="contract-sync-{region}",
        # Only where contracts come from a git repository (contracts.repo_url).
        box_when=lambda s: bool(s.contracts.repo_url),
        # One per region (deploy/k8s/base/contract-sync.yaml).
        kubernetes=Kubernetes("sco-contract-sync", "sco-contract-sync"),
    ),
)


def service(name: str) -> Service:
    """The registry's entry `name` (KeyError: no such process)."""
    for s in SERVICES:
        if s.name == name:
            return s
    raise KeyError(name)
