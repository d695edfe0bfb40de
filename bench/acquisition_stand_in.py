"""An acquisition that ends at once, under the real one's name: benches that measure what
starts acquisitions (the controller) without running them. Its own module, as the
workflow sandbox re-imports a workflow's module."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.acquisition.models import AcquisitionInput


@workflow.defn(name="AcquisitionWorkflow")
class AcquisitionStandIn:
    @workflow.run
    async def run(self, inp: AcquisitionInput) -> None:
        return None
