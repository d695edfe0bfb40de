"""A CPU training job drained by the agent through the PyTorch DCP adapter, then resumed.

The job is a separate process (this module run as `python -m tests.agent.test_agent_dcp`): a
tiny model and an Adam optimizer train on CPU; it registers `register_dcp` on the socket
the agent derives from SLURM_JOB_ID, saves with `torch.distributed.checkpoint` (single
process, no process group) when the drain asks, and exits once its answer is out. The
requeued job starts again with the same base URI and must resume from that checkpoint.
Needs torch (the CPU build; `make deps` installs it): skipped without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.checkpoint.torch_dcp import latest_step
from agent.notices import Notice
from tests.support.agent_fakes import registered, training_agent
from tests.support.paths import REPO

# Above the test's own waits (registration up to 90 s, the two runs' exits 20 s and 60 s):
# under load the wait that ran out says what did not happen, not a cut at 90 s.
pytestmark = pytest.mark.timeout(240)


def train(base_uri: str, report: Path, steps: int | None, max_seconds: float) -> int:
    """The training job: resume if a checkpoint exists, train until drained (or `steps`)."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from agent.checkpoint.torch_dcp import load_latest, register_dcp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(64, 8)
    y = x.sum(dim=1, keepdim=True)
    step = 0

    def weights() -> list[float]:
        return [v for p in model.parameters() for v in p.detach().flatten().tolist()]

    def adam_steps() -> list[float]:
        return [float(s["step"]) for s in optim.state_dict()["state"].values()]

    def snapshot() -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(model, optim)
        return {"model": model_sd, "optim": optim_sd, "step": step}

    state = snapshot()  # a fresh optimizer's state, initialised so DCP can load into it
    resumed = load_latest(state, base_uri)
    if resumed is not None:
        set_state_dict(
            model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        step = int(state["step"])
    out: dict[str, Any] = {
        "resumed_from": resumed,
        "start_step": step,
        "start_weights": weights(),
        "start_adam_steps": adam_steps(),
    }

    lock = threading.Lock()

    def to_save() -> dict[str, Any]:  # called by the adapter with `lock` held
        out["saved"] = {"step": step, "weights": weights(), "adam_steps": adam_steps()}
        return snapshot()

    server = register_dcp(to_save, base_uri, step=lambda: step, lock=lock)
    end = time.monotonic() + max_seconds
    first = step
    # No step once a drain's checkpoint is asked for: the save is of the last step.
    while not server.draining.is_set() and time.monotonic() < end:
        if steps is not None and step >= first + steps:
            break
        with lock:
            optim.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            # Tensor.backward is unannotated in torch; autograd.backward (the same) is typed.
            torch.autograd.backward(loss)
            optim.step()
            step += 1
        # sleep is the behaviour under test: a paced training step the drain interrupts
        time.sleep(0.005)
    if server.draining.is_set():
        server.answered.wait(max(0.0, end - time.monotonic()))  # the reply is out: leave
    server.close()
    out.update(final_step=step, answered_path=server.answered_path)
    report.write_text(json.dumps(out))
    return 0 if server.answered.is_set() or steps is not None else 3


def _start(tmp_path: Path, job: str, base_uri: str, report: Path, *extra: str) -> Any:
    env = {
        **os.environ,
        "SLURM_JOB_ID": job,
        "SCO_CHECKPOINT_SOCKET_DIR": str(tmp_path / "sockets"),
        "PYTHONWARNINGS": "ignore::UserWarning",  # DCP: "assuming ... single process"
    }
    command = [sys.executable, "-m", "tests.agent.test_agent_dcp", base_uri, str(report), *extra]
    return subprocess.Popen(command, cwd=REPO, env=env)


@pytest.mark.tools("torch")
async def test_a_training_job_saves_with_dcp_on_drain_and_the_restart_resumes(
    tmp_path: Path,
) -> None:
    agent, scheduler = training_agent(tmp_path, "77")
    ckpt = tmp_path / "ckpt"
    base = f"file://{ckpt}"
    socket = tmp_path / "sockets" / "slurm_77/sock"
    proc = _start(tmp_path, "77", base, tmp_path / "run1.json")
    try:
        await registered(proc, socket, within=90)  # torch's import takes a few seconds
        # sleep is the behaviour under test: it trains some steps before the notice
        await asyncio.sleep(0.5)
        deadline = datetime.now(UTC) + timedelta(seconds=30)
        started = time.monotonic()
        await agent.submit(Notice("dcp-1", "g1", deadline, "reclaim", "test"))
        await agent._drain(agent.queue.get_nowait())
        took = time.monotonic() - started
        rc = await asyncio.to_thread(proc.wait, 20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0  # it exited by itself once its answer was out
    run1 = json.loads((tmp_path / "run1.json").read_text())
    saved = run1["saved"]
    [outcome] = agent.reports[0].workloads
    assert (outcome.contract, outcome.result) == ("llm-train", "checkpointed")
    assert outcome.path == run1["answered_path"] == f"{base}/step-{saved['step']}"
    assert scheduler.ops() == [("cordon", "g1"), ("requeue", "77")]
    assert took < 30 - agent.config.safety_margin_seconds, took  # well before the deadline
    assert run1["resumed_from"] is None and saved["step"] > 0
    assert latest_step(base) == (saved["step"], ckpt / f"step-{saved['step']}")
    assert not socket.exists()  # closed on the way out

    # The requeued job starts again (same job id, same checkpoint base) and resumes.
    proc = _start(tmp_path, "77", base, tmp_path / "run2.json", "--steps", "3")
    assert await asyncio.to_thread(proc.wait, 60) == 0
    run2 = json.loads((tmp_path / "run2.json").read_text())
    assert run2["resumed_from"] == run2["start_step"] == saved["step"]
    assert run2["start_weights"] == saved["weights"]  # bit for bit
    # Adam's per-parameter step counters too (one more than ours: DCP's get_state_dict
    # initialises a fresh optimizer's state with one zero-lr step).
    assert run2["start_adam_steps"] == saved["adam_steps"] == [saved["step"] + 1.0] * 4
    assert run2["final_step"] == saved["step"] + 3  # the step counter carries on


def test_a_checkpoint_cut_off_before_its_metadata_is_not_resumed_from(tmp_path: Path) -> None:
    for step, complete in [(5, True), (9, False), (12, False)]:
        (tmp_path / f"step-{step}").mkdir()
        (tmp_path / f"step-{step}" / "__0_0.distcp").write_bytes(b"x")
        if complete:
            (tmp_path / f"step-{step}" / ".metadata").write_bytes(b"m")
    (tmp_path / "step-x").mkdir()
    assert latest_step(f"file://{tmp_path}") == (5, tmp_path / "step-5")
    assert latest_step(f"file://{tmp_path}/none") is None
    with pytest.raises(ValueError, match="file://"):
        latest_step("s3://bucket/run")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("base_uri")
    parser.add_argument("report", type=Path)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--max-seconds", type=float, default=60)
    args = parser.parse_args()
    code = train(args.base_uri, args.report, args.steps, args.max_seconds)
    # Leave without the interpreter's teardown: torch's C++ worker threads (DCP's among
    # them) can abort the process at exit ("terminate called without an active
    # exception"), which is torch's business, not the drain's. Everything is written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
