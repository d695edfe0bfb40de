"""The region in a box's Prometheus (Debian's `prometheus`): scrapes every SCO process of
the box on the ports the box gave it, and loads the alert rules of deploy/prometheus/."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from workers.devbox import process
from workers.devbox.process import DevboxError, ProcessRecord
from workers.settings import Settings

#: The one source of SCO's recording and alert rules (deploy/k8s's PrometheusRule is
#: rendered from it: `sco dev prometheus-rule`).
RULES_FILE = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules" / "sco.yml"

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
            "scrape_interval": f"{s.prometheus.scrape_seconds:g}s",
            "scrape_timeout": f"{min(s.prometheus.scrape_seconds, 10):g}s",
            "evaluation_interval": f"{s.prometheus.evaluation_seconds:g}s",
        },
        "rule_files": [str(s.prometheus.rules_dir.resolve() / "*.yml")],
        "scrape_configs": [
            {"job_name": job, "static_configs": configs} for job, configs in jobs.items()
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
        process.require_free_port("prometheus", "127.0.0.1", self.s.prometheus.port)
        base = (self.s.data_dir / "prometheus").resolve()
        base.mkdir(parents=True, exist_ok=True)
        config = base / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(self.s, self.targets), sort_keys=False))
        rec = process.start(
            [
                prom,
                f"--config.file={config}",
                f"--storage.tsdb.path={base / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.s.prometheus.port}",
                "--storage.tsdb.retention.time=7d",
            ],
            log_path,
        )
        process.wait_until("prometheus", self.ready, timeout=60, record=rec)
        return rec
