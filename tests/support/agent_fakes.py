"""Fakes for the node agent's tests (and the bench): a recording scheduler, bundles, a
workload process that answers checkpoints, an agent with a recording scheduler."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nacl.encoding import HexEncoder
from nacl.signing import SigningKey

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.scheduler import NodeScheduler, SchedulerError, Workload
from contracts import bundle, keys
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.model import EarlyWarningAction
from contracts.notice import NoticePolicy
from contracts.source import read_contracts
from tests.support.paths import EXAMPLES
from tests.support.wait import checked, eventually, eventually_async


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


NOTICE_LEAD_SECONDS = 120


def notice_key(directory: Path) -> SigningKey:
    """The notice relay's key of this test directory (made once)."""
    found = sorted((directory / "notice-keys").glob("*.key"))
    if found:
        return keys.load_signing_key(found[0])
    _, private, _ = keys.generate(directory / "notice-keys")
    return keys.load_signing_key(private)


def signed_bundle(
    directory: Path,
    *,
    serial: int = 1,
    notice_regions: Sequence[str] = (),
    early_warning: dict[str, EarlyWarningAction] | None = None,
) -> tuple[bytes, Path, SigningKey]:
    """The example contracts signed by a fresh key; returns (raw, trust dir, key). For each
    of `notice_regions` the bundle lists `notice_key(directory)` as a notice signer.
    `early_warning`: contract name -> its `drain.early_warning` opt-in."""
    trust = directory / "trust"
    if trust.is_dir() and any(trust.glob("*.key")):
        key = keys.load_signing_key(next(trust.glob("*.key")))
    else:
        _, private, _ = keys.generate(trust)
        key = keys.load_signing_key(private)
    sources, findings = read_contracts(EXAMPLES)
    assert not findings
    contracts = [s.contract for s in sources]
    for name, action in (early_warning or {}).items():
        contracts = [
            c.model_copy(update={"drain": c.drain.model_copy(update={"early_warning": action})})
            if c.name == name
            else c
            for c in contracts
        ]
    raw = bundle.build(
        contracts,
        serial=serial,
        created_at=datetime.now(UTC) - timedelta(minutes=1),
        key=key,
        notice_policies=[
            NoticePolicy(
                region=region,
                lead_seconds=NOTICE_LEAD_SECONDS,
                keys={
                    keys.key_id(notice_key(directory).verify_key): notice_key(directory)
                    .verify_key.encode(HexEncoder)
                    .decode()
                },
            )
            for region in notice_regions
        ],
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
    return AgentConfig.from_mapping(values)


# A workload: registers a checkpoint callback that answers after argv[2] seconds.
WORKLOAD_SCRIPT = """
import sys, time
from pathlib import Path
from agent.checkpoint import register
delay = float(sys.argv[2])
def checkpoint_now(reason, deadline):
    # sleep is the behaviour under test: a checkpoint that takes argv[2] seconds
    time.sleep(delay)
    return "file:///ckpt/" + reason
register(checkpoint_now, socket_path=Path(sys.argv[1]))
# sleep is the behaviour under test: the workload runs on until it is stopped
time.sleep(600)
"""


def wait_for_path(path: Path, seconds: float = 10) -> None:
    eventually(path.exists, timeout=seconds, what=f"{path} to appear")


async def registered(proc: subprocess.Popen[bytes], socket: Path, *, within: float) -> None:
    """Until a job's checkpoint socket is there, failing at once if the job dies first."""

    def up() -> bool:
        assert proc.poll() is None, "the job died before registering"
        return socket.exists()

    await eventually_async(checked(up), timeout=within, what=f"{socket} to appear", retrying=())


def training_agent(
    tmp_path: Path,
    job: str,
    *,
    early_warning: EarlyWarningAction | None = None,
    **over: Any,
) -> tuple[Agent, RecordingScheduler]:
    """An agent on node g1 (r1/D) with job `job` of llm-train (opted in to `early_warning`
    when given) on its recording scheduler."""
    opt_in = {"llm-train": early_warning} if early_warning is not None else None
    raw, trust, _ = signed_bundle(tmp_path, notice_regions=["r1"], early_warning=opt_in)
    assert BundleCache(tmp_path / "cache", TrustStore.load(trust)).offer(raw).accepted
    scheduler = RecordingScheduler(
        [
            Workload(
                id=job,
                socket_name=f"slurm_{job}",
                account="mlr",
                partition="spot",
                comment="sco-contract=llm-train",
            )
        ]
    )
    return Agent(
        agent_config(tmp_path, node="g1", **over), scheduler=scheduler, sources=[]
    ), scheduler
