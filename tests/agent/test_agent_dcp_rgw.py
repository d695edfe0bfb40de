"""DCP checkpoints on a real Ceph RGW: drained on "node 1", resumed from RGW on "node 2".

The training process is tests/agent/test_agent_dcp.py's (run as a module), given an
`s3://` base and the contract's own RGW credentials in its environment (boto3's chain),
as `sco checkpoints provision` leaves them. Node 1's agent drains it: it saves through
agent.checkpoint.s3_store (local staging, upload, COMPLETE marker last) and leaves. A new
process on node 2 (another agent's socket directory, nothing shared on disk) resumes
from RGW at the same step, weights bit for bit.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from activities.checkpoints.rgw import Credentials, Rgw, provision_all, stored
from agent.checkpoint import s3_store
from agent.notices import Notice
from tests.support.agent_fakes import registered, training_agent
from tests.support.checkpoint_bundle import two_checkpointing_contracts
from tests.support.paths import REPO
from tests.support.rgw import RgwCluster

pytestmark = pytest.mark.timeout(420)  # the first test brings RGW up (rgw.START_TIMEOUT_S)


def _creds(rgw: RgwCluster) -> dict[str, Credentials]:
    done = provision_all(Rgw(rgw.endpoint, rgw.ceph_conf), two_checkpointing_contracts(), 7)
    return {c.contract: c for c in done}


def _start(node_dir: Path, creds: Credentials, base: str, report: Path, *extra: str) -> Any:
    env = {
        **os.environ,
        **creds.env(),
        "SLURM_JOB_ID": "77",
        "SCO_CHECKPOINT_SOCKET_DIR": str(node_dir / "sockets"),
        "PYTHONWARNINGS": "ignore::UserWarning",
    }
    command = [sys.executable, "-m", "tests.agent.test_agent_dcp", base, str(report), *extra]
    return subprocess.Popen(command, cwd=REPO, env=env)


@pytest.mark.tools("torch")
async def test_drained_on_node_1_to_rgw_and_resumed_on_node_2_at_the_same_step(
    rgw: RgwCluster, tmp_path: Path
) -> None:
    creds = _creds(rgw)["llm-train"]
    base = f"s3://{creds.bucket}/{creds.prefix}/run-{time.monotonic_ns()}"
    node1, node2 = tmp_path / "node1", tmp_path / "node2"
    agent, scheduler = training_agent(node1, "77")
    socket = node1 / "sockets" / "slurm_77/sock"
    proc = _start(node1, creds, base, tmp_path / "run1.json")
    try:
        await registered(proc, socket, within=90)
        # sleep is the behaviour under test: it trains some steps before the notice
        await asyncio.sleep(0.5)
        deadline = datetime.now(UTC) + timedelta(seconds=40)
        await agent.submit(Notice("rgw-1", "g1", deadline, "reclaim", "test"))
        await agent._drain(agent.queue.get_nowait())
        rc = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0
    run1 = json.loads((tmp_path / "run1.json").read_text())
    saved = run1["saved"]
    [outcome] = agent.reports[0].workloads
    assert outcome.result == "checkpointed", outcome
    assert outcome.lost_steps == 0  # saved under the training lock at the current step
    assert outcome.path == run1["answered_path"] == f"{base}/step-{saved['step']}"
    assert scheduler.ops() == [("cordon", "g1"), ("requeue", "77")]
    where = s3_store.S3Location.parse(base)
    assert s3_store.latest(creds.s3(), where) == saved["step"] > 0
    run = base.removeprefix(f"s3://{creds.bucket}/{creds.prefix}/")
    assert [(c.step, c.complete) for c in stored(creds) if c.run == run] == [(saved["step"], True)]

    proc = _start(node2, creds, base, tmp_path / "run2.json", "--steps", "3")
    assert await asyncio.to_thread(proc.wait, 60) == 0
    run2 = json.loads((tmp_path / "run2.json").read_text())
    assert run2["resumed_from"] == run2["start_step"] == saved["step"]
    assert run2["start_weights"] == saved["weights"]
    assert run2["final_step"] == saved["step"] + 3


def test_an_upload_cut_off_by_the_deadline_leaves_no_marker_and_is_not_resumed_from(
    rgw: RgwCluster, tmp_path: Path
) -> None:
    creds = _creds(rgw)["llm-tune"]
    s3 = creds.s3()
    where = s3_store.S3Location.parse(f"s3://{creds.bucket}/cut-{time.monotonic_ns()}")
    staged = tmp_path / "staged"
    staged.mkdir()
    for name in ("__0_0.distcp", "__1_0.distcp", ".metadata"):
        (staged / name).write_bytes(b"x" * 1024)
    assert s3_store.upload(s3, staged, where, 4, deadline=time.time() + 60).endswith("step-4")
    # A clock that passes the deadline after two files went up: cut off mid-save.
    ticks = itertools.count(100.0)
    with pytest.raises(s3_store.DeadlineExceeded, match="step-9"):
        s3_store.upload(s3, staged, where, 9, deadline=102.0, clock=lambda: next(ticks))
    assert s3_store.steps(s3, where) == {4: True, 9: False}
    assert s3_store.latest(s3, where) == 4
