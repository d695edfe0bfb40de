"""Spark executor decommission through the checkpoint socket.

Mechanism: Spark (3.1+, `spark.decommission.enabled=true`) decommissions an executor when
the executor JVM receives SIGPWR: it stops taking tasks, migrates shuffle and cached RDD
blocks to other executors (`spark.storage.decommission.*`) and exits. The wrapper that
starts the executor on the node (the Slurm job script, or a sidecar sharing the pod's
process namespace) registers `decommission_executor(pid)`; on the agent's `decommission`
request it sends SIGPWR and answers at once. The agent then waits, up to the contract's
grace, for the job to leave the node, and forces it (requeue/kill) after that.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from agent.checkpoint.server import CheckpointServer, register


def decommission_executor(
    executor_pid: int, *, socket_path: Path | None = None
) -> CheckpointServer:
    def decommission(reason: str, deadline: float) -> str:
        os.kill(executor_pid, signal.SIGPWR)
        return ""

    return register(decommission=decommission, socket_path=socket_path)
