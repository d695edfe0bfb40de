"""Pending work as the schedulers report it, and how it becomes demand units.

Pure code: no I/O. Each scheduler source (Slurm, Kubernetes) reads its pending work into
`PendingWork` items; `normalise` maps them to contracts through the signed bundle's
selectors (contracts.matching: the rule the node agent drains by) and counts units of each
contract's unit shape. A contract's demand is the sum over sources (the `demand` table
keeps one row per contract and source).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from contracts.matching import PodIdentity, SlurmIdentity, match_contract
from contracts.model import Contract, UnitShape


class Scheduler(enum.StrEnum):
    SLURM = "slurm"
    KUBERNETES = "kubernetes"


class PendingWork(BaseModel):
    """One pending job (Slurm) or pod (Kubernetes): `count` copies of this shape."""

    model_config = ConfigDict(frozen=True)

    scheduler: Scheduler
    ref: str  # job id, or namespace/pod name: for reports
    # The contract the work names itself: the `sco.io/contract` label or the
    # `sco-contract=` tag of a job's comment. Slurm work without one matches nothing.
    contract: str | None = None
    namespace: str = ""  # Kubernetes
    labels: dict[str, str] = {}  # Kubernetes
    account: str = ""  # Slurm
    partition: str = ""  # Slurm
    vcpu: float = Field(ge=0)  # per copy
    memory_gib: float = Field(ge=0)  # per copy
    gpus: int = Field(default=0, ge=0)  # per copy
    count: int = Field(default=1, ge=1)

    def identity(self) -> SlurmIdentity | PodIdentity:
        """What decides its contract (contracts.matching)."""
        if self.scheduler is Scheduler.SLURM:
            return SlurmIdentity(self.contract, self.account, self.partition)
        return PodIdentity(self.contract, self.namespace, self.labels)


class Unmatched(BaseModel):
    ref: str
    reason: str


class NormalisedDemand(BaseModel):
    """One source's pending work in units per contract."""

    units: dict[str, int] = {}
    items: dict[str, int] = {}  # pending jobs/pods counted per contract
    unmatched: list[Unmatched] = []


def units_for(unit: UnitShape, work: PendingWork) -> int:
    """Units of `unit` that cover `work`: the largest dimension decides, at least one per
    copy (a pod asking for nothing still needs a place to run)."""
    per_copy = max(
        1,
        math.ceil(work.vcpu / unit.vcpu - 1e-9),
        math.ceil(work.memory_gib / unit.memory_gib - 1e-9),
        math.ceil(work.gpus / unit.gpus) if unit.gpus else 0,
    )
    return per_copy * work.count


def normalise(
    contracts: Iterable[Contract], region: str, works: Iterable[PendingWork]
) -> NormalisedDemand:
    """Units per contract of `region` for `works`; what matches nothing is listed, not lost."""
    here = [c for c in contracts if region in c.regions]
    out = NormalisedDemand()
    for work in works:
        found = match_contract(here, work.identity())
        if isinstance(found, str):
            out.unmatched.append(Unmatched(ref=work.ref, reason=found))
            continue
        out.units[found.name] = out.units.get(found.name, 0) + units_for(found.unit, work)
        out.items[found.name] = out.items.get(found.name, 0) + 1
    return out
