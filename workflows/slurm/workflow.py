"""SlurmReleaseWorkflow: delete the instances behind Slurm nodes, on Slurm's word.

Started by `sco slurm suspend` (SuspendProgram: the node was idle for SuspendTime) and
`sco slurm resume-failed` (ResumeFailProgram: no slurmd registered within ResumeTimeout).
Each instance: budgeted, idempotent delete, then DELETE in fleet state (its lifecycle
event goes through the outbox) and a release decision in the ledger. Its id is derived
from the nodes and the Slurm call, so a repeated call finds the same workflow.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.budget import TOKENS_GRANTED_SIGNAL, TokenGrant
    from workflows.budget.client import BudgetClient
    from workflows.metrics import count
    from workflows.provider_calls import delete_instance, record_release
    from workflows.slurm.models import (
        PROGRESS_QUERY,
        NodeInstance,
        ReleaseReason,
        SlurmReleaseInput,
        SlurmReleaseResult,
    )

_WHY = {
    ReleaseReason.SUSPEND: "slurm suspend: node idle for SuspendTime",
    ReleaseReason.RESUME_FAILED: "slurm resume failed: no slurmd within ResumeTimeout",
    ReleaseReason.REPLACED: "slurm resume: an instance left from the node's earlier life",
}


@workflow.defn
class SlurmReleaseWorkflow:
    def __init__(self) -> None:
        self._budget = BudgetClient()
        self._result = SlurmReleaseResult()

    @workflow.signal(name=TOKENS_GRANTED_SIGNAL)
    def tokens_granted(self, grant: TokenGrant) -> None:
        self._budget.on_grant(grant)

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> SlurmReleaseResult:
        return self._result

    @workflow.run
    async def run(self, inp: SlurmReleaseInput) -> SlurmReleaseResult:
        gate = asyncio.Semaphore(inp.max_parallel)

        async def one(inst: NodeInstance) -> None:
            async with gate:
                await self._release(inp, inst)

        await workflow.wait([asyncio.ensure_future(one(i)) for i in inp.instances])
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self._result

    async def _release(self, inp: SlurmReleaseInput, inst: NodeInstance) -> None:
        why = f"{_WHY[inp.reason]} ({inst.hostname})"
        if inst.provider_id is not None:
            await delete_instance(self._budget, inp.region, inst.provider_id)
        await record_release(
            region=inp.region,
            instance_id=inst.instance_id,
            subject=inst.workload,
            event_reason=why,
            decision_reason=f"{inst.instance_id} ({inst.pool_id}): {why}",
            price_per_hour=inst.price_per_hour,
            at=workflow.now(),
            outcome="released" if inp.reason is ReleaseReason.SUSPEND else inp.reason.value,
        )
        self._result.released.append(inst.instance_id)
        self._result.nodes.append(inst.hostname)
        count(
            "sco_slurm_nodes_released",
            "Instances behind Slurm nodes released, by why",
            region=inp.region,
            reason=inp.reason.value,
        )
