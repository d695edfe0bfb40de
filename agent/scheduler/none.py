"""No scheduler: the workloads are whatever processes registered a checkpoint socket."""

from __future__ import annotations

import logging
from pathlib import Path

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
        return [
            Workload(id=p.stem, socket_name=p.stem) for p in sorted(self._socket_dir.glob("*.sock"))
        ]

    async def requeue(self, workload: Workload, grace_seconds: int) -> None:
        log.info("no scheduler: %s cannot be requeued, it was told to stop", workload.id)

    async def force(self, workload: Workload) -> None:
        log.info("no scheduler: %s cannot be forced off the node", workload.id)
