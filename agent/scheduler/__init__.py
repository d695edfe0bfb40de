"""The narrow interface between the drain engine and the node's scheduler.

Implementations: `slurm.SlurmScheduler` (scontrol/squeue), `kubernetes.KubernetesScheduler`
(the API server over HTTPS, stdlib only) and `none.NoScheduler` (processes that registered
a checkpoint socket and nothing else). Every mutating method checks dry-run itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from agent.checkpoint.peer import JobOwner
from contracts.drain_terms import CONTRACT_LABEL, contract_tag_in_comment
from contracts.matching import PodIdentity, SlurmIdentity


@dataclass(frozen=True)
class Workload:
    """One unit of work on the node: a Slurm job or a Kubernetes pod."""

    id: str  # Slurm job id, or "<namespace>/<pod>"
    # Its checkpoint socket: <socket dir>/<socket_name>/sock (agent.checkpoint.naming).
    socket_name: str
    account: str = ""
    partition: str = ""
    comment: str = ""
    namespace: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    started_at: datetime | None = None  # when the scheduler says it started (lost work)
    # Who it runs as, as far as the scheduler says: the only peer its checkpoint socket may
    # have (agent.checkpoint.peer). uid None: whoever owns its socket directory.
    uid: int | None = None
    gid: int | None = None
    # Strings of which one must appear in /proc/<pid>/cgroup of the process serving its
    # socket: a pod's uid, a Slurm job's `/job_<id>/`. Empty: not checked.
    cgroup_markers: tuple[str, ...] = ()

    def owner(self) -> JobOwner:
        return JobOwner(self.uid, self.gid, self.cgroup_markers)

    def identity(self) -> SlurmIdentity | PodIdentity:
        """What decides its contract (contracts.matching). Every pod has a namespace; a
        Slurm job, or a bare process of the `none` scheduler, has none."""
        if self.namespace:
            return PodIdentity(self.labels.get(CONTRACT_LABEL), self.namespace, self.labels)
        return SlurmIdentity(contract_tag_in_comment(self.comment), self.account, self.partition)


def pod_cgroup_markers(pod_uid: str) -> tuple[str, ...]:
    """cgroupfs driver: .../pod<uid>/...; systemd driver: ...-pod<uid with _>.slice."""
    return (f"pod{pod_uid}", f"pod{pod_uid.replace('-', '_')}")


class SchedulerError(RuntimeError):
    """A scheduler call failed. `not_found` means the workload is already gone (a requeue
    or eviction of it has nothing left to do); `retryable` that trying again may work."""

    def __init__(self, message: str, *, not_found: bool = False, retryable: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found
        self.retryable = retryable


class NodeScheduler(Protocol):
    """What a drain needs from the scheduler; all calls are idempotent."""

    kind: str

    async def cordon(self, node: str, reason: str) -> None:
        """No new work lands on `node`. Cordoning a cordoned node is fine."""

    async def workloads(self, node: str) -> list[Workload]:
        """Work running (or about to run) on `node` now."""

    async def requeue(self, workload: Workload, grace_seconds: int) -> None:
        """Send the workload back to be run elsewhere, politely (Slurm requeue, eviction).
        Raises SchedulerError(not_found=True) when it is already gone."""

    async def force(self, workload: Workload) -> None:
        """Remove the workload now, whatever it is doing (the drain's last step)."""
