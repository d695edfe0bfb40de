"""No scheduler: the workloads are whatever processes registered a checkpoint socket.

Each job directory in the socket dir that holds a socket is one workload, owned by whoever
owns the directory (the peer check holds the process serving it to that user). Nobody
makes the directories for these jobs: the operator sets the socket dir up so that each
job can make its own and no other (see deploy/agent/README.md).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from agent.checkpoint import naming
from agent.scheduler import Workload

log = logging.getLogger(__name__)


class NoScheduler:
    kind = "none"

    def __init__(self, socket_dir: Path, *, dry_run: bool) -> None:
        self._socket_dir = socket_dir
        self.dry_run = dry_run

    async def cordon(self, node: str, reason: str) -> None:
        log.info("no scheduler: nothing to cordon on %s", node)

    async def workloads(self, node: str) -> list[Workload]:
        if not self._socket_dir.is_dir():
            return []
        return [Workload(id=name, socket_name=name) for name in _registered(self._socket_dir)]

    async def requeue(self, workload: Workload, grace_seconds: int) -> None:
        log.info("no scheduler: %s cannot be requeued, it was told to stop", workload.id)

    async def force(self, workload: Workload) -> None:
        log.info("no scheduler: %s cannot be forced off the node", workload.id)


def _registered(socket_dir: Path) -> list[str]:
    # lexists: a directory the agent may not enter is no workload, not an error. A few
    # stats of a local tmpfs: cheap enough for the event loop.
    return [
        d.name
        for d in sorted(socket_dir.iterdir())
        if os.path.lexists(d / naming.SOCKET_FILE) and not d.is_symlink()
    ]
