"""deploy/prometheus/: the rules pass `promtool check rules`, their unit tests pass
`promtool test rules`, every alert is tested firing and not firing, and deploy/k8s's
PrometheusRule is exactly the rendering of the same file (one source)."""

from __future__ import annotations

import shutil
import subprocess

import yaml

from tests.support import tools
from tests.support.paths import REPO
from workers.devbox.prometheus import GLOBAL_RULES_FILE, RULES_FILE, k8s_prometheus_rule

PROM = REPO / "deploy" / "prometheus"
UNIT_TESTS = PROM / "tests" / "sco_test.yml"
K8S_RULE = REPO / "deploy" / "k8s" / "base" / "prometheusrule.yaml"


def _alerts() -> set[str]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return {r["alert"] for g in groups for r in g["rules"] if "alert" in r}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tools.require("prometheus")
    promtool = shutil.which("promtool")
    assert promtool is not None
    return subprocess.run(
        [promtool, *args], cwd=PROM, capture_output=True, text=True, timeout=120, check=False
    )


def test_rules_pass_promtool_check() -> None:
    out = _promtool("check", "rules", str(RULES_FILE))
    assert out.returncode == 0, out.stdout + out.stderr


def test_rule_unit_tests_pass() -> None:
    out = _promtool("test", "rules", str(UNIT_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_firing_and_a_not_firing_case() -> None:
    cases = [
        case
        for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert _alerts() - fires == set(), "alerts never tested firing"
    assert _alerts() - quiet == set(), "alerts never tested not firing"
    assert len(_alerts()) >= 10


def test_the_k8s_prometheus_rule_is_the_rendered_rules_file() -> None:
    assert K8S_RULE.read_text() == k8s_prometheus_rule(RULES_FILE.read_text()), (
        "deploy/k8s/base/prometheusrule.yaml is stale: "
        "sco dev prometheus-rule > deploy/k8s/base/prometheusrule.yaml"
    )


ESTATE_TESTS = PROM / "tests" / "estate_test.yml"


def test_estate_rules_pass_promtool_check_and_their_unit_tests() -> None:
    out = _promtool("check", "rules", str(GLOBAL_RULES_FILE))
    assert out.returncode == 0, out.stdout + out.stderr
    out = _promtool("test", "rules", str(ESTATE_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_estate_alert_has_a_firing_and_a_not_firing_case() -> None:
    groups = yaml.safe_load(GLOBAL_RULES_FILE.read_text())["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    cases = [
        case
        for test in yaml.safe_load(ESTATE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    assert alerts - {c["alertname"] for c in cases if c.get("exp_alerts")} == set()
    assert alerts - {c["alertname"] for c in cases if not c.get("exp_alerts")} == set()


def test_the_estate_rules_read_only_what_the_global_prometheus_federates() -> None:
    """Every sco:* series an estate rule reads is a regional recording rule."""
    import re

    regional = {
        r["record"]
        for g in yaml.safe_load(RULES_FILE.read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    text = GLOBAL_RULES_FILE.read_text()
    read = set(re.findall(r"\bsco:[a-z_:0-9]+", text))
    assert read and read <= regional, read - regional
