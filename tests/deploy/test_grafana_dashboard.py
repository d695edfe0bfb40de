"""The on-call dashboard (deploy/grafana/sco-on-call.json) names only metrics SCO exports,
and every panel says its unit.

The box test (tests/workers/test_box_prometheus.py) proves each panel returns series from
the box's real Prometheus; this one fails in the fast tier, before any box runs, when a
panel names a metric that no process registers nor any recording rule records (a rename
that forgot the dashboard), or when a panel, or one of its queries, has no unit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "sco-on-call.json"
#: Where the processes and the node agent register or write their metrics.
SOURCES = ("services", "agent", "workflows", "activities", "workers", "contracts")
RULES = REPO / "deploy" / "prometheus" / "rules"
#: Series Prometheus makes itself, not a process.
BUILT_IN = frozenset({"up"})
#: Suffixes the client libraries add to a registered name.
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")

_METRIC = re.compile(r"\b((?:sco:|sco_)[a-zA-Z0-9_:]+|up)\b(?!\s*\()")


def panels() -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    return [p for p in loaded if p.get("type") != "row"]


def names_in(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (label values in quotes are not names)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return {m.group(1) for m in _METRIC.finditer(without_strings)}


def exported() -> set[str]:
    """Every metric name written as a string in SCO's code (or declared by `# TYPE` in a
    textfile it writes), and every recording rule."""
    names: set[str] = set()
    for top in SOURCES:
        for path in (REPO / top).rglob("*.py"):
            text = path.read_text()
            names |= set(re.findall(r"[\"'](sco_[a-z0-9_]+)[\"']", text))
            # the node agent writes a textfile: its names follow `# TYPE`
            names |= set(re.findall(r"# TYPE (sco_[a-z0-9_]+) ", text))
    for path in RULES.glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {r["record"] for r in group["rules"] if "record" in r}
    return names


def known(name: str, names: set[str]) -> bool:
    if name in names or name in BUILT_IN:
        return True
    return any(name.endswith(s) and name[: -len(s)] in names for s in SUFFIXES)


def test_every_panel_query_names_only_exported_metrics() -> None:
    names = exported()
    unknown = [
        f"{p['title']!r}: {name}"
        for p in panels()
        for t in p.get("targets", [])
        for name in sorted(names_in(t["expr"]))
        if not known(name, names)
    ]
    assert not unknown, f"{DASHBOARD.name} reads metrics nothing exports: {unknown}"


def test_every_panel_and_query_has_a_unit() -> None:
    missing = []
    for p in panels():
        config = p.get("fieldConfig", {})
        if not config.get("defaults", {}).get("unit"):
            missing.append(f"{p['title']!r}: no unit")
        refs = {o["matcher"]["options"] for o in config.get("overrides", [])}
        for o in config.get("overrides", []):
            assert o["matcher"]["id"] == "byFrameRefID", o
            assert {x["id"] for x in o["properties"]} == {"unit"}, o
        targets = {t["refId"] for t in p.get("targets", [])}
        assert refs <= targets, f"{p['title']!r}: overrides for queries it has not: {refs}"
    assert not missing, missing


def test_the_scan_catches_a_renamed_metric(tmp_path: Path) -> None:
    """Probe: a name no process exports is caught, a suffix of a registered one is not."""
    names = exported()
    assert not known("sco_no_such_metric_total", names)
    assert known("sco_acquisition_duration_seconds_bucket", names)
    assert names_in('sum by (hall) (rate(sco_x_total{state="sco_y"}[5m]))') == {"sco_x_total"}
