"""DemandIntakeWorkflow: one per region, forever.

Every `interval_seconds` (or at once on `collect_now`) it has the `demand.collect` activity
read the region's scheduler sources (pending Slurm jobs, unschedulable Kubernetes pods),
store each source's normalised units, and then wakes the controller partitions whose
contracts' demand changed with `demand_changed`, so a new pending job is planned within
seconds, not at the next 60 s tick. The `status` query shows the last round per source.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.control.models import partition_of
    from activities.demand.intake import CollectInput, CollectResult, DemandIntakeActivities
    from workflows.controller.models import (
        DEMAND_CHANGED_SIGNAL,
        DemandChanged,
        controller_workflow_id,
    )
    from workflows.intake.models import (
        COLLECT_NOW_SIGNAL,
        STATUS_QUERY,
        CollectNow,
        IntakeInput,
        IntakeRound,
        IntakeStatus,
    )
    from workflows.metrics import count


@workflow.defn
class DemandIntakeWorkflow:
    @workflow.init
    def __init__(self, inp: IntakeInput) -> None:
        self._inp = inp
        self._now = False
        self._status = IntakeStatus(
            region=inp.region, rounds=inp.rounds, failing_since=dict(inp.failing_since)
        )

    @workflow.signal(name=COLLECT_NOW_SIGNAL)
    def collect_now(self, inp: CollectNow) -> None:
        self._now = True

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> IntakeStatus:
        return self._status

    @workflow.run
    async def run(self, inp: IntakeInput) -> None:
        cfg = inp.config
        for _ in range(cfg.rounds_per_run):
            await self._round()
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._now, timeout=timedelta(seconds=cfg.interval_seconds)
                )
            self._now = False
            if workflow.info().is_continue_as_new_suggested():
                break
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            inp.model_copy(
                update={
                    "rounds": self._status.rounds,
                    "failing_since": self._status.failing_since,
                }
            )
        )

    async def _round(self) -> None:
        inp = self._inp
        now = workflow.now()
        summary = IntakeRound(round=self._status.rounds + 1, at=now)
        failing = self._status.failing_since
        stale = timedelta(seconds=inp.config.stale_after_seconds)
        try:
            result: CollectResult = await workflow.execute_activity_method(
                DemandIntakeActivities.collect,
                CollectInput(
                    region=inp.region,
                    drop_if_failing=sorted(s for s, at in failing.items() if now - at >= stale),
                ),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
        except ActivityError as exc:
            # One bad round (fleet state down) is reported and retried next round.
            summary.problem = f"collect failed: {exc.cause or exc}"
            workflow.logger.warning("demand intake %s: %s", inp.region, summary.problem)
        else:
            summary.bundle_serial = result.bundle_serial
            summary.problem = result.problem
            summary.reports = result.reports
            summary.changed = result.changed
            for report in result.reports:
                if report.ok:
                    failing.pop(report.source, None)
                else:
                    failing.setdefault(report.source, now)
                    count(
                        "sco_demand_source_errors",
                        "Intake rounds in which a scheduler source could not be read",
                        region=inp.region,
                        source=report.source,
                    )
            await self._wake(result.changed, summary)
        self._status.rounds += 1
        self._status.last = summary

    async def _wake(self, changed: list[str], summary: IntakeRound) -> None:
        parts: dict[int, list[str]] = {}
        for contract in changed:
            parts.setdefault(partition_of(contract, self._inp.config.partitions), []).append(
                contract
            )
        for partition, contracts in sorted(parts.items()):
            wid = controller_workflow_id(self._inp.region, partition)
            try:
                await workflow.get_external_workflow_handle(wid).signal(
                    DEMAND_CHANGED_SIGNAL, DemandChanged(contracts=contracts, source="intake")
                )
                summary.signalled.append(wid)
            except Exception as exc:  # not running: it plans when it starts anyway
                workflow.logger.warning("cannot wake %s: %s", wid, exc)
                summary.not_running.append(wid)
