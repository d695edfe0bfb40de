"""The region in a box's Prometheus (Debian's `prometheus`): scrapes every SCO process of
the box on the ports the box gave it, and loads the alert rules of deploy/prometheus/."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from workers.devbox import process
from workers.devbox.process import DevboxError, ProcessRecord
from workers.settings import Settings

#: The one source of SCO's recording and alert rules (deploy/k8s's PrometheusRule is
#: rendered from it: `sco dev prometheus-rule`).
RULES_FILE = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules" / "sco.yml"
#: The estate-wide rules the global Prometheus evaluates over what it federates.
GLOBAL_RULES_FILE = (
    Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "global" / "estate.yml"
)
#: What the global Prometheus federates from each region's: the recording rules (sco:*),
#: the alerts, and the per-hall floor series the estate view reads.
FEDERATED = (
    '{__name__=~"sco:.+"}',
    '{__name__="ALERTS"}',
    '{__name__=~"sco_floor_(units|target_units|held_units|state|lost_halls)"}',
    '{__name__=~"sco_(pools_excluded|acquisitions_open)"}',
)

_K8S_HEADER = """\
# GENERATED from deploy/prometheus/rules/sco.yml by `sco dev prometheus-rule`; do not edit.
# The Prometheus Operator loads it (tests/deploy/test_prometheus_rules.py keeps them equal).
"""


def k8s_prometheus_rule(rules_yaml: str) -> str:
    """The rules file as a PrometheusRule of the Prometheus Operator, groups unchanged."""
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "sco-rules", "labels": {"app.kubernetes.io/name": "sco-rules"}},
        "spec": {"groups": yaml.safe_load(rules_yaml)["groups"]},
    }
    return _K8S_HEADER + yaml.safe_dump(doc, sort_keys=False, width=120)


@dataclass(frozen=True)
class Target:
    job: str  # one job per kind of process: sco-worker, sco-notice-relay, ...
    port: int


def scrape_config(s: Settings, targets: list[Target]) -> dict[str, object]:
    jobs: dict[str, list[dict[str, object]]] = {}
    for t in targets:
        jobs.setdefault(t.job, []).append({"targets": [f"127.0.0.1:{t.port}"]})
    return {
        "global": {
            **_intervals(s),
            # Series that lack it (up, Temporal's runtime metrics) get the region, so the
            # global Prometheus tells regions apart.
            "external_labels": {"region": s.region},
        },
        "rule_files": [str(s.prometheus.rules_dir.resolve() / "*.yml")],
        "scrape_configs": [
            {"job_name": job, "static_configs": configs} for job, configs in jobs.items()
        ],
    }


def _intervals(s: Settings) -> dict[str, str]:
    return {
        "scrape_interval": f"{s.prometheus.scrape_seconds:g}s",
        "scrape_timeout": f"{min(s.prometheus.scrape_seconds, 10):g}s",
        "evaluation_interval": f"{s.prometheus.evaluation_seconds:g}s",
    }


def federation_config(s: Settings, regions: dict[str, str]) -> dict[str, object]:
    """The global Prometheus: one federation job per region (`sco-federate-<region>`,
    honouring the region's labels), the estate-wide rules of deploy/prometheus/global/."""
    return {
        "global": _intervals(s),
        "rule_files": [str(GLOBAL_RULES_FILE)],
        "scrape_configs": [
            {
                "job_name": f"sco-federate-{region}",
                "honor_labels": True,
                "metrics_path": "/federate",
                "params": {"match[]": list(FEDERATED)},
                "static_configs": [
                    {"targets": [url.removeprefix("http://")], "labels": {"region": region}}
                ],
            }
            for region, url in regions.items()
        ],
    }


def binary() -> str | None:
    return shutil.which("prometheus")


class PrometheusProcess:
    """Started by the box (always ours: its config is the box's)."""

    def __init__(self, s: Settings, targets: list[Target]) -> None:
        self.s = s
        self.targets = targets

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.s.prometheus.port}"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start(self, log_path: Path) -> ProcessRecord:
        prom = binary()
        if prom is None:
            raise DevboxError("prometheus: not installed (apt-get install prometheus)")
        return _start(
            "prometheus",
            self.s.prometheus.port,
            self.s.data_dir / "prometheus" / self.s.region,
            scrape_config(self.s, self.targets),
            log_path,
            self.ready,
        )


class GlobalPrometheusProcess(PrometheusProcess):
    """The estate's global Prometheus (`prometheus.global_port`), federating each
    region's Prometheus (region name → its URL)."""

    def __init__(self, s: Settings, regions: dict[str, str]) -> None:
        super().__init__(s, [])
        self.regions = regions

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.s.prometheus.global_port}"

    def start(self, log_path: Path) -> ProcessRecord:
        return _start(
            "prometheus-global",
            self.s.prometheus.global_port,
            self.s.data_dir / "prometheus" / "global",
            federation_config(self.s, self.regions),
            log_path,
            self.ready,
        )


def _start(
    name: str,
    port: int,
    base: Path,
    config_doc: dict[str, object],
    log_path: Path,
    ready: Callable[[], bool],
) -> ProcessRecord:
    prom = binary()
    if prom is None:
        raise DevboxError(f"{name}: not installed (apt-get install prometheus)")
    process.require_free_port(name, "127.0.0.1", port)
    base = base.resolve()
    base.mkdir(parents=True, exist_ok=True)
    config = base / "prometheus.yml"
    config.write_text(yaml.safe_dump(config_doc, sort_keys=False))
    rec = process.start(
        [
            prom,
            f"--config.file={config}",
            f"--storage.tsdb.path={base / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=7d",
        ],
        log_path,
    )
    process.wait_until(name, ready, timeout=60, record=rec)
    return rec
