"""RegionControllerWorkflow: one per region x partition, forever.

Every tick (60 s, or within a moment of a `demand_changed` signal) it reads a snapshot of
its partition, reconciles desired against actual with pure planning code, starts
acquisitions for what is missing (recording each before it starts, so the next tick counts
it even if the child has not run yet) and releases reclaimable capacity that has been
surplus for longer than the idle limit. Acquisitions are children with an ABANDON parent
close policy: they outlive the controller's continue-as-new.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import PinnedVersioningOverride, RetryPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.budget import TOKENS_GRANTED_SIGNAL, TokenGrant
    from activities.control.activities import ControlActivities
    from activities.control.exact_plan import ExactPlanInput, ExactPlanResult
    from activities.control.models import (
        ACQUISITION_PREFIX,
        ControllerSnapshot,
        InstanceBrief,
        MarkSurplusInput,
        MarkSurplusOutput,
        SnapshotInput,
    )
    from activities.fleet.control_state import AcquisitionRecord
    from planning.choice import ChoiceExplainer, ChoiceRecord
    from planning.models import LoadRisk
    from planning.planner import Plan, PlanInput, plan
    from workflows import search_attributes as sa
    from workflows.acquisition.models import AcquisitionInput, AcquisitionState
    from workflows.acquisition.workflow import AcquisitionWorkflow
    from workflows.budget.client import BudgetClient
    from workflows.controller.models import (
        DEMAND_CHANGED_SIGNAL,
        STATUS_QUERY,
        ControllerInput,
        ControllerStatus,
        DemandChanged,
        TickSummary,
    )
    from workflows.controller.reconcile import AcquisitionRequest, plan_input, reconcile
    from workflows.metrics import count
    from workflows.provider_calls import delete_instance, record_release
    from workflows.tracing import following_signal

#: Ticks plan in a local activity (control.greedy_plan), not in the workflow task. Runs
#: started before it keep planning in the workflow until their continue-as-new.
PLAN_OFF_THREAD_PATCH = "plan-off-thread"
#: Ticks target demand plus each contract's headroom units (contracts/headroom.py). Asked
#: only on a tick whose snapshot carries headroom, so runs and histories without any take
#: the same commands as before; runs started before it keep planning demand alone.
HEADROOM_PATCH = "headroom"

_RETRY = RetryPolicy(maximum_attempts=10, maximum_interval=timedelta(seconds=30))


def _choice(why: ChoiceExplainer | None, req: AcquisitionRequest) -> ChoiceRecord | None:
    """Why the plan chose the acquisition's pools (planning/choice.py), recorded with it;
    None without the tick's problem and plan (runs that plan in the workflow task). Pure,
    so replays compute the same; a failure here must never stop a tick."""
    if why is None:
        return None
    try:
        return why.for_acquisition(req.contract, {i.pool_id for i in req.items})
    except Exception as exc:  # a why-record is never worth a stuck controller
        workflow.logger.warning("no choice record for %s: %s", req.contract, exc)
        return None


def _pinned_here() -> PinnedVersioningOverride | None:
    """Acquisitions are short: on versioned workers they are pinned to the build that
    started them and finish there during a rollout (the long-lived entities auto-upgrade and
    change only behind `workflow.patched`). Unversioned workers: no override."""
    version = workflow.info().get_current_deployment_version()
    if version is None or not version.deployment_name or not version.build_id:
        return None
    return PinnedVersioningOverride(version)


@workflow.defn
class RegionControllerWorkflow:
    @workflow.init
    def __init__(self, inp: ControllerInput) -> None:
        self._inp = inp
        self._dirty = True  # plan at once after a start or continue-as-new
        # Request ids are <workflow id>#<counter>: the counter must survive continue-as-new.
        self._budget = BudgetClient(start_counter=inp.budget_counter)
        self._status = ControllerStatus(
            region=inp.region,
            partition=inp.partition,
            ticks=inp.ticks,
            acquisitions_started=inp.acquisitions_started,
            released=inp.released,
        )

    @workflow.signal(name=DEMAND_CHANGED_SIGNAL)
    def demand_changed(self, inp: DemandChanged) -> None:
        self._dirty = True

    @workflow.signal(name=TOKENS_GRANTED_SIGNAL)
    def tokens_granted(self, grant: TokenGrant) -> None:
        self._budget.on_grant(grant)

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> ControllerStatus:
        # Read-only (tests/workflows/test_queries_read_only.py): a copy, never a write.
        return self._status.model_copy(update={"pending_signal": self._dirty}, deep=True)

    @workflow.run
    async def run(self, inp: ControllerInput) -> None:
        cfg = inp.config
        workflow.upsert_search_attributes(
            [sa.REGION.value_set(inp.region), sa.STATE.value_set("controlling")]
        )
        for _ in range(cfg.ticks_per_run):
            # Woken by demand_changed at once, or by the tick.
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._dirty, timeout=timedelta(seconds=cfg.tick_seconds)
                )
            self._dirty = False
            # After a demand change, the tick belongs to that change's trace.
            with following_signal(DEMAND_CHANGED_SIGNAL, "ControllerTick"):
                await self._tick()
            if workflow.info().is_continue_as_new_suggested():
                break
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            inp.model_copy(
                update={
                    "ticks": self._status.ticks,
                    "acquisitions_started": self._status.acquisitions_started,
                    "released": self._status.released,
                    "budget_counter": self._budget.counter,
                }
            )
        )

    async def _tick(self) -> None:
        inp, cfg = self._inp, self._inp.config
        snap: ControllerSnapshot = await workflow.execute_activity_method(
            ControlActivities.snapshot,
            SnapshotInput(
                region=inp.region,
                partition=inp.partition,
                partitions=cfg.partitions,
                reclaim_window_hours=cfg.reclaim_window_hours,
                load_risk=LoadRisk(
                    full_rate=cfg.load_risk_rate, free_share=cfg.load_risk_free_share
                ),
            ),
            start_to_close_timeout=timedelta(seconds=120),
            heartbeat_timeout=timedelta(seconds=60),
            retry_policy=_RETRY,
        )
        now = workflow.now()
        self._status.ticks += 1
        summary = TickSummary(
            tick=self._status.ticks, at=now, bundle_serial=snap.bundle_serial, problem=snap.problem
        )
        self._status.last = summary
        if snap.problem:
            workflow.logger.warning(
                "controller %s/p%d: %s", inp.region, inp.partition, snap.problem
            )
            return
        planned: Plan | None = None  # ticks that plan off-thread record why (_choice)
        headroom = False
        if workflow.patched(PLAN_OFF_THREAD_PATCH):
            headroom = any(v.headroom_units > 0 for v in snap.contracts) and workflow.patched(
                HEADROOM_PATCH
            )
            planned = None
            if snap.contracts:  # else nothing to plan, no activity call
                planned = await self._plan_off_thread(snap, headroom=headroom)
                if planned is None:
                    summary.problem = "planning failed: the tick plans nothing"
                    return
            result = reconcile(snap, cfg, now, planned=planned, headroom=headroom)
        elif workflow.patched("exact-plan"):
            # Runs that began before plan-off-thread: the greedy plan in the workflow task.
            problem = plan_input(snap, cfg)
            result = reconcile(snap, cfg, now, planned=await self._improve(problem, plan(problem)))
        else:
            result = reconcile(snap, cfg, now)
        count(
            "sco_shortfall_units",
            "Demand units reclaimable capacity could not cover, summed per tick",
            result.shortfall_units,
            region=inp.region,
        )
        summary.demand_units = result.demand_units
        summary.held_units = result.held_units
        summary.planned_units = result.planned_units
        summary.shortfall_units = result.shortfall_units
        summary.plan_cost_per_hour = result.plan_cost_per_hour
        summary.headroom_units = result.headroom_units
        summary.headroom_short_units = result.headroom_short_units
        k8s = {v.demand.contract for v in snap.contracts if v.kubernetes}
        # Why each acquisition's pools, from this tick's own problem and plan (no command).
        why = None
        if planned is not None and result.acquisitions:
            why = ChoiceExplainer(plan_input(snap, cfg, headroom=headroom), planned)
        for req in result.acquisitions:
            acq_id = f"{ACQUISITION_PREFIX}{inp.region}-{req.contract}-{workflow.uuid4().hex[:10]}"
            acq = AcquisitionInput(
                region=inp.region,
                partition=inp.partition,
                contract=req.contract,
                tier=req.tier,
                items=req.items,
                fallback=req.fallback,
                approval_timeout_seconds=cfg.approval_timeout_seconds,
                fallback_lease_hours=cfg.fallback_lease_hours,
                build_timeout_seconds=cfg.build_timeout_seconds,
                poll_seconds=cfg.acquisition_poll_seconds,
                kubelet_user_data=cfg.kubernetes_user_data if req.contract in k8s else None,
            )
            fb = req.fallback
            await workflow.execute_activity_method(
                ControlActivities.record_acquisition,
                AcquisitionRecord(
                    acquisition_id=acq_id,
                    region=inp.region,
                    workload=req.contract,
                    partition=inp.partition,
                    state=AcquisitionState.STARTING.value,
                    requested_units=sum(i.units for i in req.items) + (fb.units if fb else 0),
                    requested_instances=sum(i.instances for i in req.items)
                    + (sum(i.instances for i in fb.items) if fb else 0),
                    pool_ids=sorted({i.pool_id for i in req.items}),
                    choice=_choice(why, req),
                ),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=_RETRY,
            )
            await workflow.start_child_workflow(
                AcquisitionWorkflow.run,
                acq,
                id=acq_id,
                parent_close_policy=ParentClosePolicy.ABANDON,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                versioning_override=_pinned_here(),
            )
            summary.acquisitions.append(acq_id)
            self._status.acquisitions_started += 1
            count(
                "sco_acquisitions_started", "Acquisitions a controller started", region=inp.region
            )
        await self._release(snap, result.surplus, summary)
        summary.surplus = len(result.surplus)

    async def _plan_off_thread(
        self, snap: ControllerSnapshot, *, headroom: bool = False
    ) -> Plan | None:
        """The greedy plan from a local activity (the planner's CPU time is spent on the
        worker's activity threads, never in a workflow task; the history records the plan),
        then improved as in :meth:`_improve`. None when planning failed: a planner error is
        deterministic, so the tick plans nothing rather than retrying forever."""
        problem = plan_input(snap, self._inp.config, headroom=headroom)
        try:
            greedy: Plan = await workflow.execute_local_activity_method(
                ControlActivities.greedy_plan,
                problem,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=2),
            )
        except ActivityError as exc:
            workflow.logger.warning("greedy plan failed, nothing planned this tick: %s", exc)
            return None
        return await self._improve(problem, greedy)

    async def _improve(self, problem: PlanInput, greedy: Plan) -> Plan:
        """The greedy plan, replaced by the exact one (an activity under a time budget) when
        that finds a better one in time. A tick with nothing to launch and no shortfall has
        nothing to improve and makes no activity call (the history stays short)."""
        cfg = self._inp.config
        if cfg.exact_plan_seconds <= 0 or not (
            greedy.allocations or any(o.shortfall_units for o in greedy.outcomes)
        ):
            return greedy
        try:
            exact: ExactPlanResult = await workflow.execute_activity_method(
                ControlActivities.exact_plan,
                ExactPlanInput(
                    problem=problem, greedy=greedy, time_budget_seconds=cfg.exact_plan_seconds
                ),
                # The budget bounds the solve; the rest is (de)serialising the problem.
                start_to_close_timeout=timedelta(seconds=cfg.exact_plan_seconds + 10),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as exc:
            workflow.logger.warning("exact plan failed, the greedy plan stands: %s", exc)
            return greedy
        return exact.plan

    async def _release(
        self, snap: ControllerSnapshot, surplus: list[str], summary: TickSummary
    ) -> None:
        inp, cfg = self._inp, self._inp.config
        marked: MarkSurplusOutput = await workflow.execute_activity_method(
            ControlActivities.mark_surplus,
            MarkSurplusInput(
                region=inp.region,
                workloads=[v.demand.contract for v in snap.contracts],
                instance_ids=surplus,
            ),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=_RETRY,
        )
        now = workflow.now()
        briefs: dict[str, tuple[str, InstanceBrief]] = {
            i.instance_id: (v.demand.contract, i) for v in snap.contracts for i in v.instances
        }
        for instance_id in surplus:
            since = marked.since.get(instance_id)
            if since is None or now - since < timedelta(seconds=cfg.release_idle_seconds):
                continue
            contract, brief = briefs[instance_id]
            if brief.provider_id is None:
                continue
            # One attempt: a failed release is tried again next tick, with a fresh token.
            if not await delete_instance(
                self._budget,
                inp.region,
                brief.provider_id,
                attempts=1,
                call_timeout=timedelta(seconds=120),
            ):
                continue
            idle = int((now - since).total_seconds())
            await record_release(
                region=inp.region,
                instance_id=instance_id,
                subject=contract,
                event_reason=f"released: idle {idle} s",
                decision_reason=f"{instance_id} ({brief.pool_id}) surplus for {idle} s",
                price_per_hour=brief.price_per_hour,
                at=now,
            )
            summary.released.append(instance_id)
            self._status.released += 1
            count(
                "sco_instances_released", "Idle reclaimable instances released", region=inp.region
            )
