"""Starting and signalling a pool's exclusion workflow from outside it: the notice relay's
hook, `sco reclaim` and Slurm's power programs. Signal-with-start, so a pool's workflow is
started on its first notice."""

from __future__ import annotations

from datetime import datetime

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy

from workflows.exclusion.models import (
    RECLAIM_NOTICED_SIGNAL,
    WORKFLOW_TYPE,
    ExclusionConfig,
    ReclaimNoticed,
    exclusion_input,
    exclusion_workflow_id,
)


async def ensure_exclusion(
    client: Client,
    task_queue: str,
    pool_id: str,
    config: ExclusionConfig | None = None,
) -> WorkflowHandle[object, None]:
    """Start the pool's exclusion workflow unless it runs already; its handle."""
    handle: WorkflowHandle[object, None] = await client.start_workflow(
        WORKFLOW_TYPE,
        exclusion_input(pool_id, config),
        id=exclusion_workflow_id(pool_id),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return handle


async def notify_reclaim(
    client: Client,
    region: str,
    task_queue: str,
    pool_id: str,
    instance_id: str,
    at: datetime,
    *,
    config: ExclusionConfig | None = None,
) -> None:
    """Tell the pool's exclusion workflow an instance got a reclaim notice (signal-with-
    start: the workflow is started when not running). Idempotent: notices are deduplicated
    by instance id. `config` applies only when this starts the workflow."""
    inp = exclusion_input(pool_id, config)
    if inp.region != region:
        raise ValueError(f"pool {pool_id} is not in region {region}")
    await client.start_workflow(
        WORKFLOW_TYPE,
        inp,
        id=exclusion_workflow_id(pool_id),
        task_queue=task_queue,
        start_signal=RECLAIM_NOTICED_SIGNAL,
        start_signal_args=[ReclaimNoticed(instance_id=instance_id, at=at)],
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
