"""Inputs and outputs of the Slurm node release workflow.

New fields always get defaults, so histories recorded before them still decode.
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, Field

#: Handler names, used by the workflow's decorators and by every client. Running
#: workflows answer to these strings: never rename one.
PROGRESS_QUERY = "progress"


class ReleaseReason(enum.StrEnum):
    SUSPEND = "suspend"  # SuspendProgram: Slurm powers the idle node down
    RESUME_FAILED = "resume_failed"  # ResumeFailProgram: no slurmd within ResumeTimeout
    REPLACED = "replaced"  # ResumeProgram found an instance of the node's earlier life


class NodeInstance(BaseModel):
    instance_id: str
    hostname: str
    pool_id: str
    workload: str
    provider_id: str | None = None
    price_per_hour: float = 0.0


class SlurmReleaseInput(BaseModel):
    region: str
    reason: ReleaseReason
    instances: list[NodeInstance] = Field(min_length=1)
    max_parallel: int = Field(default=20, ge=1)


class SlurmReleaseResult(BaseModel):
    released: list[str] = []  # instance ids deleted and recorded
    nodes: list[str] = []  # their hostnames
