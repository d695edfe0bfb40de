"""The agent on an early warning: opted-in jobs checkpoint early and keep running on a node
that stays usable; the hard notice that follows drains as always."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.notices import SignedMessage
from agent.scheduler import Workload
from contracts.model import EarlyWarningAction
from contracts.notice import NoticeStage, ReclaimNotice
from contracts.notice_signing import sign
from tests.agent.test_agent_checkpoint import workload_process
from tests.agent.test_agent_dcp import _start
from tests.support.agent_fakes import notice_key, registered, training_agent

__all__ = ["workload_process"]  # the fixture, shared with the checkpoint tests

pytestmark = pytest.mark.timeout(90)


def signed(tmp_path: Path, *, seconds: float, early: bool) -> SignedMessage:
    """A relay-signed notice for node g1 (r1/D): an early warning `seconds` ahead, or the
    hard notice with that deadline."""
    now = datetime.now(UTC)
    deadline = now + timedelta(seconds=seconds)
    notice = ReclaimNotice(
        notice_id=(
            ReclaimNotice.early_id("r1", "g1", deadline)
            if early
            else ReclaimNotice.stable_id("r1", "g1", now)
        ),
        region="r1",
        hall="D",
        node="g1",
        pool_id="r1.D.gpu-a.xl",
        issued_at=now,
        deadline=deadline,
        reason="planned reclaim",
        stage=NoticeStage.EARLY if early else NoticeStage.HARD,
    )
    return SignedMessage(sign(notice, notice_key(tmp_path)), "nats")


async def test_an_opted_in_job_saves_on_the_early_warning_and_keeps_running(
    tmp_path: Path, workload_process: Any
) -> None:
    agent, scheduler = training_agent(tmp_path, "41", early_warning=EarlyWarningAction.CHECKPOINT)
    proc = workload_process(tmp_path / "sockets" / "slurm_41/sock", 0)
    await agent.submit(signed(tmp_path, seconds=900, early=True))
    await agent._drain(agent.queue.get_nowait())
    early = agent.reports[-1]
    [outcome] = early.workloads
    assert early.early and early.as_event()["event"] == "early_warning_handled"
    assert (outcome.contract, outcome.action, outcome.result) == (
        "llm-train",
        "early_checkpoint",
        "saved",
    )
    assert outcome.path == "file:///ckpt/planned reclaim"
    assert scheduler.ops() == []  # not cordoned: the node stays usable
    assert proc.poll() is None  # the job goes on

    await agent.submit(signed(tmp_path, seconds=60, early=False))
    await agent._drain(agent.queue.get_nowait())
    [hard] = agent.reports[-1].workloads
    assert hard.result == "checkpointed" and not agent.reports[-1].early
    assert scheduler.ops() == [("cordon", "g1"), ("requeue", "41")]


async def test_an_early_warning_leaves_jobs_that_did_not_opt_in_alone(
    tmp_path: Path, workload_process: Any
) -> None:
    agent, scheduler = training_agent(tmp_path, "42")  # llm-train without early_warning
    proc = workload_process(tmp_path / "sockets" / "slurm_42/sock", 0)
    await agent.submit(signed(tmp_path, seconds=900, early=True))
    await agent._drain(agent.queue.get_nowait())
    assert agent.reports[-1].early and agent.reports[-1].workloads == []
    assert scheduler.ops() == [] and proc.poll() is None


async def test_an_early_decommission_cordons_and_waits_for_the_job_to_leave(
    short_tmp: Path,
) -> None:
    """Spark: the executor leaves on the warning; the node is cordoned so it does not come
    back to a doomed node."""
    from agent.checkpoint import register
    from agent.daemon import Agent
    from contracts.cache import BundleCache
    from contracts.keys import TrustStore
    from tests.support.agent_fakes import RecordingScheduler, agent_config, signed_bundle

    raw, trust, _ = signed_bundle(
        short_tmp,
        notice_regions=["r1"],
        early_warning={"spark-etl": EarlyWarningAction.DECOMMISSION},
    )
    assert BundleCache(short_tmp / "cache", TrustStore.load(trust)).offer(raw).accepted
    executor = Workload(
        id="data-pipelines/etl-exec-1",
        socket_name="pod-data-pipelines-etl-exec-1",
        namespace="data-pipelines",
        labels={"app.kubernetes.io/component": "spark-executor", "sco.io/contract": "spark-etl"},
    )
    scheduler = RecordingScheduler([executor])
    agent = Agent(agent_config(short_tmp, node="g1"), scheduler=scheduler, sources=[])

    def decommission(reason: str, deadline: float) -> str:
        scheduler.workloads_on_node = []  # the executor migrated its blocks and exited
        return ""

    with register(
        decommission=decommission,
        socket_path=short_tmp / "sockets" / "pod-data-pipelines-etl-exec-1/sock",
    ):
        await agent.submit(signed(short_tmp, seconds=900, early=True))
        await agent._drain(agent.queue.get_nowait())
    [outcome] = agent.reports[-1].workloads
    assert (outcome.contract, outcome.result) == ("spark-etl", "decommissioned")
    assert scheduler.ops() == [("cordon", "g1")]


@pytest.mark.tools("torch")
@pytest.mark.timeout(240)
async def test_a_dcp_job_warned_early_loses_at_most_one_step(tmp_path: Path) -> None:
    """A real DCP job: an early checkpoint while it trains on, then the hard drain saves
    again; the requeued job resumes from the hard save, losing at most one step."""
    from agent.checkpoint.torch_dcp import latest_step

    agent, _ = training_agent(tmp_path, "43", early_warning=EarlyWarningAction.CHECKPOINT)
    base = f"file://{tmp_path / 'ckpt'}"
    sock = tmp_path / "sockets" / "slurm_43/sock"
    proc = _start(tmp_path, "43", base, tmp_path / "run1.json")
    try:
        await registered(proc, sock, within=150)  # torch's import: a minute on a loaded box
        await agent.submit(signed(tmp_path, seconds=900, early=True))
        await agent._drain(agent.queue.get_nowait())
        [early] = agent.reports[-1].workloads
        assert early.result == "saved" and proc.poll() is None
        early_step = int(early.path.rsplit("-", 1)[1])
        # sleep is the behaviour under test: it trains on (more steps) after the early save
        await asyncio.sleep(0.5)
        await agent.submit(signed(tmp_path, seconds=60, early=False))
        await agent._drain(agent.queue.get_nowait())
        assert await asyncio.to_thread(proc.wait, 20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    [hard] = agent.reports[-1].workloads
    run1 = json.loads((tmp_path / "run1.json").read_text())
    assert hard.result == "checkpointed" and hard.lost_steps is not None
    assert hard.lost_steps <= 1
    # The loop takes no step once the drain's save is asked for: the resume point is its
    # last step.
    assert run1["final_step"] - run1["saved"]["step"] <= 1
    found = latest_step(base)
    assert found is not None and found[0] == run1["saved"]["step"] > early_step
