"""Which contract a job or pod runs under: the one rule of the node agent and the control plane.

It is admission's rule (contracts/admission/), so whatever admission let onto reclaimable
capacity is drained, and counted as demand, under the contract admission accepted it for:

    Slurm       the job's comment names a tag (`sco-contract=<tag>`), and a Slurm selector
                with that tag (default: the contract's name) allows the job's account and
                partition; accounts compare in lower case, as Slurm stores them
    Kubernetes  the pod's `sco.io/contract` label names the contract, and one of that
                contract's kubernetes selectors takes the pod: same namespace, and the pod
                carries every selector label

Work that names no contract, or names one whose selectors do not take it, runs under none:
the control plane counts no demand for it and the node agent drains it by its
conservative default. A name alone is not enough (a job could name any contract), and a
selector alone is not either (admission refuses unnamed work on reclaimable capacity).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from contracts.drain_terms import CONTRACT_LABEL, SLURM_TAG_PREFIX, slurm_tag


class _SlurmSelector(Protocol):
    @property
    def account(self) -> str: ...
    @property
    def partition(self) -> str: ...
    @property
    def tag(self) -> str | None: ...


class _KubernetesSelector(Protocol):
    @property
    def namespace(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...


class _Selectors(Protocol):
    @property
    def slurm(self) -> Sequence[_SlurmSelector]: ...
    @property
    def kubernetes(self) -> Sequence[_KubernetesSelector]: ...


class Matchable(Protocol):
    """A contract as the control plane (contracts.model.Contract) or a node
    (contracts.node_bundle.NodeContract) holds it: the rule reads the same fields."""

    @property
    def name(self) -> str: ...
    @property
    def selectors(self) -> _Selectors: ...


M = TypeVar("M", bound=Matchable)


@dataclass(frozen=True)
class SlurmIdentity:
    """What decides a Slurm job's contract."""

    tag: str | None  # from its comment: contracts.model.contract_tag_in_comment
    account: str
    partition: str


@dataclass(frozen=True)
class PodIdentity:
    """What decides a Kubernetes pod's contract."""

    contract: str | None  # its sco.io/contract label
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)


def match_contract(contracts: Iterable[M], work: SlurmIdentity | PodIdentity) -> M | str:
    """The one contract `work` runs under, or the reason there is none."""
    if isinstance(work, SlurmIdentity):
        if not work.tag:
            return f"job names no contract (--comment={SLURM_TAG_PREFIX}<name>)"
        scheduler, named = "slurm", work.tag
        account = work.account.lower()
        hits = [
            c
            for c in contracts
            for s in c.selectors.slurm
            if slurm_tag(c.name, s.tag) == work.tag
            and s.account.lower() == account
            and s.partition == work.partition
        ]
    else:
        if not work.contract:
            return f"pod names no contract (label {CONTRACT_LABEL}=<name>)"
        scheduler, named = "kubernetes", work.contract
        hits = [
            c
            for c in contracts
            if c.name == work.contract
            for s in c.selectors.kubernetes
            if s.namespace == work.namespace
            and all(work.labels.get(k) == v for k, v in s.labels.items())
        ]
    names = sorted({c.name for c in hits})
    if len(names) == 1:
        return hits[0]
    if not names:
        return f"no contract's {scheduler} selector matches this work naming {named!r}"
    return f"ambiguous: selectors of {', '.join(names)} all match"
