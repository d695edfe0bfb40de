"""PyTorch Distributed Checkpoint (DCP) adapter; torch is imported only when it is used.

    from agent.checkpoint.torch_dcp import register_dcp
    register_dcp(lambda: {"model": model.state_dict(), "optim": optim.state_dict()},
                 "file:///shared/ckpt/run-7", step=lambda: step)

On a checkpoint request every call saves `state()` with `torch.distributed.checkpoint.save`
to `<base>/step-<step>` and answers with that path. In a multi-rank job each rank
registers (its own socket) and DCP coordinates the ranks' shards. Only `file://` paths are
written by this adapter; object-store targets need an fsspec-backed storage writer.
Untested here (torch is not a dependency of the agent).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.checkpoint.server import CheckpointServer, register


def register_dcp(
    state: Callable[[], dict[str, Any]],
    base_uri: str,
    *,
    step: Callable[[], int],
    socket_path: Path | None = None,
) -> CheckpointServer:
    if not base_uri.startswith("file://"):
        raise ValueError("register_dcp writes file:// checkpoints only")
    base = Path(base_uri.removeprefix("file://"))

    def checkpoint_now(reason: str, deadline: float) -> str:
        dcp: Any = importlib.import_module("torch.distributed.checkpoint")
        target = base / f"step-{step()}"
        dcp.save(state(), checkpoint_id=str(target))
        return f"file://{target}"

    return register(checkpoint_now, socket_path=socket_path)
