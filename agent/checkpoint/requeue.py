"""For stateless jobs that want a last word before the agent requeues them.

`on_requeue(cleanup)` registers a checkpoint callback that runs `cleanup` (flush logs,
release a lease) and answers at once; the agent then requeues the job as usual. Without a
helper a requeue-contract job is simply requeued: registering is optional.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent.checkpoint.server import CheckpointServer, register


def on_requeue(
    cleanup: Callable[[str], None] | None = None, *, socket_path: Path | None = None
) -> CheckpointServer:
    def checkpoint_now(reason: str, deadline: float) -> str:
        if cleanup is not None:
            cleanup(reason)
        return ""  # nothing saved: the job restarts from the beginning

    return register(checkpoint_now, socket_path=socket_path)
