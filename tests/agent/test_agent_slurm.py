"""The agent against a real one-node Slurm (slurmctld + slurmd on loopback) and real NATS:
a notice drains the node and requeues the contract's job. Skips when slurmd cannot start."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from agent.daemon import Agent
from agent.natslink import NatsLink
from agent.scheduler.slurm import SlurmScheduler
from agent.sources.nats import NatsNoticeSource
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.notice import ReclaimNotice
from contracts.notice_signing import sign
from tests.support import tools
from tests.support.agent_fakes import agent_config, notice_key, signed_bundle
from tests.support.agent_slurm_cluster import NODE, agent_slurm_cluster, node_state
from tests.support.slurm_cluster import SlurmCluster
from tests.support.wait import WaitTimeout, checked, eventually, eventually_async
from tests.support.worker_nats import NATS_URL

pytestmark = pytest.mark.timeout(55)


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    tools.require(*tools.SLURMCTLD_SLURMD)
    try:
        with agent_slurm_cluster() as cluster:
            yield cluster
    except RuntimeError as exc:
        pytest.skip(f"Slurm with slurmd cannot start here: {str(exc)[:400]}")


@pytest.fixture
def region(nats_region: tuple[Client, str]) -> str:
    return nats_region[1]


def job_field(slurm: SlurmCluster, job: str, key: str) -> str:
    out = slurm.run("scontrol", "show", "job", job).stdout
    for token in out.split():
        if token.startswith(f"{key}="):
            return token.split("=", 1)[1]
    return ""


async def test_a_notice_drains_the_node_and_requeues_the_job(
    slurm: SlurmCluster, region: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))  # the agent's scontrol/squeue
    raw, trust, _ = signed_bundle(tmp_path, notice_regions=[region])
    assert BundleCache(tmp_path / "cache", TrustStore.load(trust)).offer(raw).accepted
    submitted = slurm.run(
        "sbatch", "--parsable", "--account=ci", "--partition=spot", "--requeue",
        "--comment=sco-contract=ci", "--wrap", "sleep 300",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    queued = time.monotonic()
    try:
        await eventually_async(
            checked(lambda: job_field(slurm, job, "JobState") == "RUNNING"),
            timeout=60,
            what=f"job {job} running",
        )
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}: {slurm.log()[-2000:]}") from exc

    config = agent_config(
        tmp_path, node=NODE, region=region, scheduler="slurm", nats_urls=[NATS_URL]
    )
    link = NatsLink([NATS_URL])
    source = NatsNoticeSource(link, region, "D", NODE)
    agent = Agent(config, scheduler=SlurmScheduler(dry_run=False), sources=[source], link=link)
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    nc = await nats.connect(NATS_URL)
    try:
        await asyncio.wait_for(source.watching.wait(), 10)
        now = datetime.now(UTC)
        notice = ReclaimNotice(
            notice_id=ReclaimNotice.stable_id(region, NODE, now),
            region=region,
            hall="D",
            node=NODE,
            pool_id="p",
            issued_at=now,
            deadline=now + timedelta(seconds=120),
        )
        await nc.jetstream().publish(notice.subject, sign(notice, notice_key(tmp_path)))
        await eventually_async(checked(lambda: agent.reports), timeout=60, what="the drain report")
    finally:
        await nc.close()
        stop.set()
        await asyncio.wait_for(run, 30)
    report = agent.reports[0]
    assert report.cordoned and not report.conservative
    assert [(w.workload, w.contract, w.result) for w in report.workloads] == [
        (job, "ci-runners", "requeued")
    ]
    # Requeued with nothing saved: its run time so far is lost, from squeue's start time
    # (the job ran before the agent started; a generous bound for a loaded machine).
    lost = report.workloads[0].lost_seconds
    assert lost is not None and 0 < lost < time.monotonic() - queued + 2, lost
    assert node_state(slurm).startswith("drain")
    assert job_field(slurm, job, "Restarts") == "1"
    # slurmctld lists the requeued job COMPLETING until the node's slurmd reports its step
    # gone (seconds on a loaded machine), then PENDING: waited for, not looked at once.
    eventually(
        lambda: job_field(slurm, job, "JobState") in ("PENDING", "REQUEUED"),
        timeout=60,
        what=f"job {job} pending again after its requeue",
    )
    reason = slurm.run("sinfo", "-h", "-R", "-n", NODE, "-o", "%E").stdout
    assert notice.notice_id in reason
