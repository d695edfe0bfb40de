"""Fakes for the node agent's tests (and the bench): a recording scheduler, bundles.

Imported by the other test_agent_* modules; its own tests check the fake keeps the
`NodeScheduler` contract.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from agent.config import AgentConfig
from agent.scheduler import NodeScheduler, SchedulerError, Workload
from contracts import bundle, keys
from contracts.source import read_contracts

EXAMPLES = Path(__file__).resolve().parent.parent / "contracts" / "examples"


@dataclass
class RecordingScheduler:
    """Holds workloads in memory and records every call with its monotonic time."""

    workloads_on_node: list[Workload] = field(default_factory=list)
    dry_run: bool = False
    calls: list[tuple[str, str, float]] = field(default_factory=list)
    next_error: SchedulerError | None = None
    kind: str = "fake"

    def _record(self, op: str, target: str) -> None:
        self.calls.append((op, target, time.monotonic()))
        if self.next_error is not None:
            err, self.next_error = self.next_error, None
            raise err

    async def cordon(self, node: str, reason: str) -> None:
        self._record("cordon", node)

    async def workloads(self, node: str) -> list[Workload]:
        return list(self.workloads_on_node)

    async def requeue(self, workload: Workload, grace_seconds: int) -> None:
        self._record("requeue", workload.id)
        self.workloads_on_node = [w for w in self.workloads_on_node if w.id != workload.id]

    async def force(self, workload: Workload) -> None:
        self._record("force", workload.id)
        self.workloads_on_node = [w for w in self.workloads_on_node if w.id != workload.id]

    def ops(self) -> list[tuple[str, str]]:
        return [(op, target) for op, target, _ in self.calls]


_check: type[NodeScheduler] = RecordingScheduler  # the fake keeps the interface


def signed_bundle(directory: Path, *, serial: int = 1) -> tuple[bytes, Path, SigningKey]:
    """The example contracts signed by a fresh key; returns (raw, trust dir, key)."""
    trust = directory / "trust"
    if trust.is_dir() and any(trust.glob("*.key")):
        key = keys.load_signing_key(next(trust.glob("*.key")))
    else:
        _, private, _ = keys.generate(trust)
        key = keys.load_signing_key(private)
    sources, findings = read_contracts(EXAMPLES)
    assert not findings
    raw = bundle.build(
        [s.contract for s in sources],
        serial=serial,
        created_at=datetime.now(UTC) - timedelta(minutes=1),
        key=key,
    )
    return raw, trust, key


def agent_config(tmp: Path, *, node: str, region: str = "r1", **over: Any) -> AgentConfig:
    values: dict[str, object] = {
        "node_id": node,
        "region": region,
        "hall": "D",
        "scheduler": "none",
        "nats_urls": [],
        "cache_dir": tmp / "cache",
        "trust_dir": tmp / "trust",
        "journal_path": tmp / "journal" / "journal.jsonl",
        "socket_dir": tmp / "sockets",
        "safety_margin_seconds": 0.5,
    }
    values.update(over)
    return AgentConfig.model_validate(values)


async def test_the_recording_scheduler_records_and_queues_an_error() -> None:
    fake = RecordingScheduler([Workload(id="1", socket_name="slurm-1")])
    await fake.cordon("n1", "why")
    fake.next_error = SchedulerError("gone", not_found=True)
    try:
        await fake.requeue(fake.workloads_on_node[0], 5)
    except SchedulerError as exc:
        assert exc.not_found
    assert fake.ops() == [("cordon", "n1"), ("requeue", "1")]
