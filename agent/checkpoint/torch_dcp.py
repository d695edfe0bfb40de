"""PyTorch Distributed Checkpoint (DCP) adapter; torch is imported only when it is used.

    from agent.checkpoint.torch_dcp import latest_step, load_latest, register_dcp

    lock = threading.Lock()              # held by the training loop around each step
    state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": 0}
    resumed = load_latest(state, "file:///shared/ckpt/run-7")   # None on a fresh start
    server = register_dcp(lambda: {...current state...}, "file:///shared/ckpt/run-7",
                          step=lambda: step, lock=lock)
    while not server.draining.is_set():  # a drain's save is asked: no step after it
        with lock:
            train_one_step()
    server.answered.wait()               # the agent has the path: leave, it requeues us

On a checkpoint request the adapter takes `lock` (when given, so no optimizer step runs
half-saved), saves `state()` with `torch.distributed.checkpoint.save` to
`<base>/step-<step>` and answers with that `file://` URI. DCP writes the directory's
`.metadata` file last, so a save cut off by the deadline leaves a directory without it,
and `load_latest` skips it. A single process needs no process group (DCP saves and loads
"in a single process" when torch.distributed is not initialized; checked with torch
2.13); in a multi-rank job each rank registers (its own socket) and DCP coordinates the
ranks' shards. An `s3://bucket/prefix` base (Ceph RGW) goes through
agent.checkpoint.s3_store: DCP saves to local staging, the files go up, and a `COMPLETE`
marker goes up last, before the deadline or not at all. Exercised by
tests/agent/test_agent_dcp.py (file://) and tests/agent/test_agent_dcp_rgw.py (a drained
process on one node, resumed from RGW on another).
"""

from __future__ import annotations

import contextlib
import importlib
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.checkpoint import s3_store
from agent.checkpoint.protocol import Saved
from agent.checkpoint.server import CheckpointServer, register

_STEP_DIR = re.compile(r"step-(\d+)")


def _base(base_uri: str) -> Path:
    if not base_uri.startswith("file://"):
        raise ValueError(f"{base_uri}: not a file:// checkpoint base")
    return Path(base_uri.removeprefix("file://"))


def _dcp() -> Any:
    return importlib.import_module("torch.distributed.checkpoint")


def _is_s3(base_uri: str) -> bool:
    return base_uri.startswith("s3://")


def latest_step(base_uri: str) -> tuple[int, Path] | None:
    """The newest complete checkpoint under a `file://` base (its step and directory)."""
    base = _base(base_uri)
    found = []
    for child in base.glob("step-*") if base.is_dir() else []:
        match = _STEP_DIR.fullmatch(child.name)
        if match and (child / ".metadata").is_file():
            found.append((int(match.group(1)), child))
    return max(found) if found else None


def load_latest(state: dict[str, Any], base_uri: str) -> int | None:
    """Load the newest complete checkpoint into `state` in place (DCP semantics: tensors
    are filled in, other values replaced); its step, or None when there is none."""
    if _is_s3(base_uri):
        s3, where = s3_store.client(), s3_store.S3Location.parse(base_uri)
        found = s3_store.latest(s3, where)
        if found is not None:
            s3_store.load_staged(
                lambda d: _dcp().load(state, checkpoint_id=str(d)), s3, where, found
            )
        return found
    latest = latest_step(base_uri)
    if latest is None:
        return None
    step, directory = latest
    _dcp().load(state, checkpoint_id=str(directory))
    return step


def register_dcp(
    state: Callable[[], dict[str, Any]],
    base_uri: str,
    *,
    step: Callable[[], int],
    lock: threading.Lock | threading.RLock | None = None,
    socket_path: Path | None = None,
) -> CheckpointServer:
    if _is_s3(base_uri):
        where = s3_store.S3Location.parse(base_uri)
        s3 = s3_store.client()

        def checkpoint_s3(reason: str, deadline: float) -> Saved:
            with lock if lock is not None else contextlib.nullcontext():
                current, snapshot = step(), state()
                uri = s3_store.save_staged(
                    lambda d: _dcp().save(snapshot, checkpoint_id=str(d)),
                    s3,
                    where,
                    current,
                    deadline,
                )
                # Saved under the training lock at the current step: nothing is behind it.
                return Saved(uri, lost_steps=step() - current)

        return register(checkpoint_s3, socket_path=socket_path)
    base = _base(base_uri)

    def checkpoint_now(reason: str, deadline: float) -> Saved:
        dcp = _dcp()
        with lock if lock is not None else contextlib.nullcontext():
            current = step()
            target = base / f"step-{current}"
            dcp.save(state(), checkpoint_id=str(target))
            return Saved(f"file://{target}", lost_steps=step() - current)

    return register(checkpoint_now, socket_path=socket_path)
