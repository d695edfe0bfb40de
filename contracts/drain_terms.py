"""What a node acts on in a contract, apart from the contract's pydantic model: the drain
actions, the label and comment that name a contract. The node agent imports this, never
contracts/model.py (it imports no pydantic, decision 0041); the model re-exports these.
"""

from __future__ import annotations

import enum
import re

#: Kubernetes label on pods naming their contract; Slurm jobs carry it in --comment.
CONTRACT_LABEL = "sco.io/contract"
SLURM_TAG_PREFIX = "sco-contract="


class DrainAction(enum.StrEnum):
    DECOMMISSION = "decommission"  # Spark executor decommission: migrate blocks, exit
    CHECKPOINT = "checkpoint"  # checkpoint now (PyTorch DCP), then exit
    REQUEUE = "requeue"  # stateless: requeue / evict


class EarlyWarningAction(enum.StrEnum):
    """What a workload does on an early warning (a reclaim planned ahead, its hard notice
    still to come) while its node is still fully usable."""

    NONE = "none"  # nothing until the hard notice
    CHECKPOINT = "checkpoint"  # save a checkpoint now and keep running (drain: checkpoint)
    DECOMMISSION = "decommission"  # leave now: Spark decommission (drain: decommission)


def slurm_tag(contract: str, selector_tag: str | None) -> str:
    """The tag a Slurm selector of `contract` takes: its own, else the contract's name."""
    return selector_tag or contract


_TAG = re.compile(rf"(?:^|[\s,;]){re.escape(SLURM_TAG_PREFIX)}([a-z0-9-]+)")


def contract_tag_in_comment(comment: str | None) -> str | None:
    """The contract a Slurm job names in its comment (`sco-contract=<name>`), if any."""
    match = _TAG.search(comment or "")
    return match[1] if match else None
