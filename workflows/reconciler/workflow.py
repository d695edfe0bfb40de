"""ReconcilerWorkflow: one per region (id `reconciler-<region>`), forever.

Every `interval_seconds` (5 min) one pass: a snapshot of both sides (SCO's servers by
metadata and Blazar leases by name at the provider; live instances in fleet state), the
pure comparison (`compare.py`), then the mending: orphan servers deleted through the
region's token budget (`provider_calls.delete_instance`, three attempts: what stays is
tried again next pass), orphan leases deleted the same way, ghosts marked lost (a DELETE
lifecycle event with the reason, after the provider says NotFound once more), fallback
leases in use renewed. Each pass that finds anything is a RECONCILE ledger decision with
its counts, and every count is a metric. `dry_run` finds and reports only. `once` runs
one pass and returns its report (what `sco reconcile` starts).

Continue-as-new after `passes_per_run` passes or when Temporal suggests it.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.budget import TOKENS_GRANTED_SIGNAL, TokenGrant
    from activities.control.activities import ControlActivities
    from activities.decisions import Decision, DecisionKind
    from activities.provider.activities import ExtendReservationInput, ProviderActivities
    from activities.reconciler.activities import ReconcilerActivities
    from activities.reconciler.models import (
        MarkLostInput,
        MarkLostResult,
        ReconcileSnapshot,
        ReconcileSnapshotInput,
    )
    from workflows.budget.client import BudgetClient
    from workflows.metrics import count
    from workflows.provider_calls import STATE_RETRY, delete_instance, delete_lease
    from workflows.reconciler.compare import ReconcilePlan, plan_reconcile
    from workflows.reconciler.models import LAST_REPORT_QUERY, ReconcileReport, ReconcilerInput

_RETRY = RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=30))


@workflow.defn
class ReconcilerWorkflow:
    @workflow.init
    def __init__(self, inp: ReconcilerInput) -> None:
        self._inp = inp
        self._budget = BudgetClient(start_counter=inp.budget_counter)
        self._report = ReconcileReport(region=inp.region, dry_run=inp.dry_run)

    @workflow.signal(name=TOKENS_GRANTED_SIGNAL)
    def tokens_granted(self, grant: TokenGrant) -> None:
        self._budget.on_grant(grant)

    @workflow.query(name=LAST_REPORT_QUERY)
    def last_report(self) -> ReconcileReport:
        return self._report

    @workflow.run
    async def run(self, inp: ReconcilerInput) -> ReconcileReport:
        cfg = inp.config
        for _ in range(cfg.passes_per_run):
            await self._pass()
            if inp.once:
                return self._report
            await workflow.sleep(timedelta(seconds=cfg.interval_seconds))
            if workflow.info().is_continue_as_new_suggested():
                break
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(inp.model_copy(update={"budget_counter": self._budget.counter}))

    async def _pass(self) -> None:
        inp, cfg = self._inp, self._inp.config
        try:
            snap: ReconcileSnapshot = await workflow.execute_activity_method(
                ReconcilerActivities.snapshot,
                ReconcileSnapshotInput(region=inp.region),
                start_to_close_timeout=timedelta(seconds=120),
                retry_policy=_RETRY,
            )
        except ActivityError as exc:
            workflow.logger.warning("reconcile %s: no snapshot, next pass: %s", inp.region, exc)
            return
        # Ages by the clock the provider and fleet state keep (the snapshot's), not the
        # workflow's: both sides' timestamps come from there.
        now = snap.taken_at
        plan = plan_reconcile(
            snap,
            now,
            grace=timedelta(seconds=cfg.grace_seconds),
            renew_before=timedelta(hours=cfg.renew_before_hours),
        )
        report = ReconcileReport(
            region=inp.region,
            at=now,
            dry_run=inp.dry_run,
            orphan_servers=[f"{s.name} ({s.provider_id})" for s in plan.orphan_servers],
            orphan_leases=[r.name for r in plan.orphan_leases],
            ghosts=[g.instance_id for g in plan.ghosts],
            renewed=[r.name for r in plan.renew] if not inp.dry_run else [],
            passes=self._report.passes + 1,
        )
        if not inp.dry_run:
            await self._mend(plan, report, snap)
        self._report = report
        self._count(plan, report)
        if not plan.empty:
            await self._decide(plan, report)

    async def _mend(
        self, plan: ReconcilePlan, report: ReconcileReport, snap: ReconcileSnapshot
    ) -> None:
        region, cfg = self._inp.region, self._inp.config
        for server in plan.orphan_servers:
            if await delete_instance(self._budget, region, server.provider_id, attempts=3):
                report.deleted_servers += 1
        for lease in plan.orphan_leases:
            if await delete_lease(self._budget, region, lease.lease_id):
                report.deleted_leases += 1
        for ghost in plan.ghosts:
            result: MarkLostResult = await workflow.execute_activity_method(
                ReconcilerActivities.mark_lost,
                MarkLostInput(
                    region=region,
                    instance_id=ghost.instance_id,
                    provider_id=ghost.provider_id,
                    reason=f"lost: the provider has no instance {ghost.provider_id} (reconciler)",
                ),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=STATE_RETRY,
            )
            report.marked_lost += int(result.marked)
        for lease in plan.renew:
            await self._budget.take(region, 1)
            try:
                await workflow.execute_activity_method(
                    ProviderActivities.extend_reservation,
                    ExtendReservationInput(
                        lease_id=lease.lease_id,
                        end=snap.taken_at + timedelta(hours=cfg.lease_hours),
                    ),
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                )
            except ActivityError as exc:
                workflow.logger.warning("renewing lease %s: %s", lease.name, exc.cause)

    def _count(self, plan: ReconcilePlan, report: ReconcileReport) -> None:
        region = self._inp.region
        for what, n in (
            ("orphan_server", len(plan.orphan_servers)),
            ("orphan_lease", len(plan.orphan_leases)),
            ("ghost", len(plan.ghosts)),
            ("lease_renewal", len(plan.renew)),
        ):
            count(
                "sco_reconcile_found", "What reconciler passes found", n, region=region, kind=what
            )
        count(
            "sco_reconcile_mended",
            "What reconciler passes mended",
            report.deleted_servers + report.deleted_leases + report.marked_lost,
            region=region,
        )

    async def _decide(self, plan: ReconcilePlan, report: ReconcileReport) -> None:
        mended = (
            f"; deleted {report.deleted_servers} server(s) and {report.deleted_leases} "
            f"lease(s), marked {report.marked_lost} lost"
        )
        await workflow.execute_activity_method(
            ControlActivities.record_decision,
            Decision(
                event_id=workflow.uuid4(),
                occurred_at=workflow.now(),
                region=self._inp.region,
                kind=DecisionKind.RECONCILE,
                subject=self._inp.region,
                outcome="dry_run" if self._inp.dry_run else "mended",
                reason=plan.summary() + ("" if self._inp.dry_run else mended),
                units=len(plan.orphan_servers) + len(plan.ghosts),
                workflow_id=workflow.info().workflow_id,
            ),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=STATE_RETRY,
        )
