"""PyTorch Distributed Checkpoint (DCP) adapter; torch is imported only when it is used.

    from agent.checkpoint.torch_dcp import latest_step, load_latest, register_dcp

    lock = threading.Lock()              # held by the training loop around each step
    state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": 0}
    resumed = load_latest(state, "file:///shared/ckpt/run-7")   # None on a fresh start
    server = register_dcp(lambda: {...current state...}, "file:///shared/ckpt/run-7",
                          step=lambda: step, lock=lock)
    while not server.answered.is_set():  # the agent has the path: leave, it requeues us
        with lock:
            train_one_step()

On a checkpoint request the adapter takes `lock` (when given, so no optimizer step runs
half-saved), saves `state()` with `torch.distributed.checkpoint.save` to
`<base>/step-<step>` and answers with that `file://` URI. DCP writes the directory's
`.metadata` file last, so a save cut off by the deadline leaves a directory without it,
and `load_latest` skips it. A single process needs no process group (DCP saves and loads
"in a single process" when torch.distributed is not initialized; checked with torch
2.13); in a multi-rank job each rank registers (its own socket) and DCP coordinates the
ranks' shards. Only `file://` paths are written here; object-store targets need an
fsspec-backed storage writer. Exercised by tests/agent/test_agent_dcp.py (a CPU training
process drained by the agent, then resumed).
"""

from __future__ import annotations

import contextlib
import importlib
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.checkpoint.server import CheckpointServer, register

_STEP_DIR = re.compile(r"step-(\d+)")


def _base(base_uri: str) -> Path:
    if not base_uri.startswith("file://"):
        raise ValueError("the DCP adapter reads and writes file:// checkpoints only")
    return Path(base_uri.removeprefix("file://"))


def _dcp() -> Any:
    return importlib.import_module("torch.distributed.checkpoint")


def latest_step(base_uri: str) -> tuple[int, Path] | None:
    """The newest complete checkpoint under `base_uri` (its step and directory)."""
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
    base = _base(base_uri)

    def checkpoint_now(reason: str, deadline: float) -> str:
        dcp = _dcp()
        with lock if lock is not None else contextlib.nullcontext():
            target = base / f"step-{step()}"
            dcp.save(state(), checkpoint_id=str(target))
        return f"file://{target}"

    return register(checkpoint_now, socket_path=socket_path)
