"""The node agent's Prometheus textfile: what node_exporter's textfile collector reads,
checked with prometheus_client's own parser of the text format."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from agent.drain import DrainReport, WorkloadOutcome
from agent.metrics import AgentMetrics, drain_outcome


def _report(*results: str, finished_ms: float = 12_000, error: str = "") -> DrainReport:
    return DrainReport(
        notice_id="n",
        node="node-1",
        source="nats",
        deadline="",
        bundle_serial=1,
        conservative=False,
        dry_run=False,
        finished_ms=finished_ms,
        error=error,
        workloads=[
            WorkloadOutcome(workload=f"w{i}", contract=None, action="requeue", result=r, told_ms=5)
            for i, r in enumerate(results)
        ],
    )


def _samples(path: Path) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(path.read_text())
        for s in family.samples
    }


def test_outcomes() -> None:
    assert drain_outcome(_report("requeued", "checkpointed")) == "clean"
    assert drain_outcome(_report("requeued", "forced")) == "forced"
    assert drain_outcome(_report("forced", "failed")) == "failed"
    assert drain_outcome(_report(error="cordon refused")) == "failed"


def test_the_textfile_counts_notices_refusals_drains_and_workloads(tmp_path: Path) -> None:
    path = tmp_path / "sco-agent.prom"
    metrics = AgentMetrics(path, "node-1")
    assert path.exists()  # written at start: a fresh node shows zeros, not nothing
    metrics.notice_received("nats")
    metrics.notice_refused("bad_signature")
    metrics.drain_finished(_report("requeued", "forced", finished_ms=12_000))
    metrics.drain_finished(_report("failed", finished_ms=400_000))
    got = _samples(path)
    node = ("node", "node-1")
    assert got["sco_agent_notices_received_total", frozenset({node, ("source", "nats")})] == 1
    refused = frozenset({node, ("reason", "bad_signature")})
    assert got["sco_agent_notices_refused_total", refused] == 1
    assert got["sco_agent_workloads_told_total", frozenset({node})] == 3
    assert got["sco_agent_workloads_forced_total", frozenset({node})] == 1
    forced = {node, ("outcome", "forced")}
    assert got["sco_agent_drain_duration_seconds_count", frozenset(forced)] == 1
    assert got["sco_agent_drain_duration_seconds_sum", frozenset(forced)] == 12.0
    assert got["sco_agent_drain_duration_seconds_bucket", frozenset({*forced, ("le", "5.0")})] == 0
    assert got["sco_agent_drain_duration_seconds_bucket", frozenset({*forced, ("le", "15.0")})] == 1
    failed = {node, ("outcome", "failed")}
    assert (
        got["sco_agent_drain_duration_seconds_bucket", frozenset({*failed, ("le", "300.0")})] == 0
    )
    assert got["sco_agent_drain_duration_seconds_bucket", frozenset({*failed, ("le", "+Inf")})] == 1
    assert not list(tmp_path.glob(".*.tmp"))  # written by rename: nothing half-written left


def test_an_unwritable_textfile_never_stops_the_agent(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    path = tmp_path / "a-file" / "sco-agent.prom"  # its directory cannot exist
    metrics = AgentMetrics(path, "node-1")
    metrics.notice_received("nats")  # logged, not raised
    assert metrics.received["nats"] == 1 and not path.exists()
