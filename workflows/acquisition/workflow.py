"""AcquisitionWorkflow: one batch of launches for one contract in one region.

Each instance is a *slot* with a deterministic id (`<workflow id>-<n>`), which is also the
provider-side name: the provider's create is idempotent on it, so a retried or replayed
create never makes a second instance. A slot: record the instance in fleet state
(REQUESTED, with its ACQUIRE event through the outbox) -> take one token from the region's
budget -> create (one attempt per token: every mutating API call is paid for, retries
included) -> wait for ACTIVE -> record READY. Capacity errors are a *shortfall* reported to
the controller, never a workflow failure. A run that does fail (an activity out of retries:
fleet state down for longer than STATE_RETRY, say) first deletes every instance it created
(compensation); the region's reconciler is the second net for what even that cannot delete.

Committed fallback (a Blazar reservation per hall, then boots into it) runs only when the
arbiter's plan is within the contract's spend authority or an operator approves it through
the `approve_fallback` update before the deadline.

Operators steer it with updates (`pause`, `resume`, `cancel`, `approve_fallback`) and read
it with the `progress` query; search attributes let the Temporal UI list acquisitions by
region, hall, pool, contract and state, with requested and acquired counts.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from activities.budget import TOKENS_GRANTED_SIGNAL, TokenGrant
    from activities.control.activities import ControlActivities
    from activities.decisions import Decision, DecisionKind
    from activities.events import CapacityType, EventKind
    from activities.fleet.activities import (
        FleetActivities,
        RecordAcquireInput,
        RecordEventInput,
    )
    from activities.fleet.control_state import AcquisitionRecord
    from activities.fleet.repository import InstanceSpec
    from activities.provider.activities import (
        ProviderActivities,
        WaitActiveInput,
    )
    from activities.provider.interface import HOSTNAME_KEY, CreateRequest, ReservationRequest
    from activities.provider.leases import fallback_owner, lease_name
    from contracts.node_labels import kubelet_join_args
    from workflows import search_attributes as sa
    from workflows.acquisition.decisions import CreateNext, create_retry, fallback_verdict
    from workflows.acquisition.models import (
        APPROVE_FALLBACK_UPDATE,
        CANCEL_UPDATE,
        FINISHED,
        PAUSE_UPDATE,
        PROGRESS_QUERY,
        RESUME_UPDATE,
        AcquisitionInput,
        AcquisitionProgress,
        AcquisitionResult,
        AcquisitionState,
        ApprovalInput,
        ControlAck,
        FallbackState,
        LaunchItem,
        OperatorInput,
    )
    from workflows.budget.client import BudgetClient
    from workflows.budget.pooled import PooledTokens
    from workflows.metrics import count
    from workflows.provider_calls import (
        NOT_RETRIED,
        RETRIED_BY_US,
        STATE_RETRY,
        delete_instance,
        error_type,
        lost,
        reserve,
    )
    from workflows.updates import named_update

# workflow.patched id: pause and resume record a ledger decision (see _operator_decision).
OPERATOR_DECISIONS_PATCH = "operator-pause-resume-decisions"


#: `workflow.patched` ids: command sequences that changed while acquisitions ran.
PATCH_CHECK_AFTER_TOKEN = "pause-cancel-after-token"
PATCH_BOUNDED_CREATE = "bounded-lost-create"
PATCH_CANCEL_AT_ONCE = "cancel-state-at-once"
#: A failing acquisition deletes what it created (its slots' failures used to be dropped).
PATCH_COMPENSATE = "compensate-failed-acquisition"
#: A failing acquisition answers the updates in flight (pause, resume, cancel) before it
#: ends: it used to compensate and fail at once, dropping them.
PATCH_FAILED_WAITS_HANDLERS = "failed-acquisition-waits-handlers"
#: A cancel deletes at once: what is up goes now, boots are stopped and deleted, creates in
#: flight are deleted as they land, no create is retried (it used to wait for every launch
#: to end, up to the build bound, before deleting anything).
PATCH_CANCEL_DELETES_AT_ONCE = "cancel-deletes-at-once"
#: The slots' create tokens are asked for together (workflows/budget/pooled.py): one
#: request and one grant signal per burst of slots, not one each (which stalled the budget
#: and the acquisition for ~0.5 s steps on the operator's path).
PATCH_POOLED_TOKENS = "pooled-create-tokens"
#: Compensation's own fleet-state writes: bounded, the database may be what failed (the
#: region's reconciler settles what they leave behind).
COMPENSATION_STATE_RETRY = RetryPolicy(maximum_attempts=3)


class _Slot:
    __slots__ = (
        "busy",
        "capacity_type",
        "hostname",
        "instance_id",
        "item",
        "provider_id",
        "reservation_id",
        "units",
        "waiting",
    )

    def __init__(
        self, instance_id: str, item: LaunchItem, units: int, hostname: str | None = None
    ) -> None:
        self.instance_id = instance_id
        self.item = item
        self.units = units
        self.hostname = hostname
        self.capacity_type = item.capacity_type
        self.provider_id: str | None = None
        self.reservation_id: str | None = item.reservation_id
        # Its launch still works on the instance (boot, READY): a cancel leaves the delete
        # to the launch, which sees the cancel when it is done.
        self.busy = False
        self.waiting: workflow.ActivityHandle[Any] | None = None  # its boot, while waited on


def _slots(prefix: str, items: list[LaunchItem]) -> list[_Slot]:
    """Instances of every item, with the units each covers (the last may be part-filled)."""
    out: list[_Slot] = []
    for item in items:
        per = -(-item.units // item.instances) if item.units else 0
        left = item.units
        for n in range(item.instances):
            units = min(per, left)
            left -= units
            if item.hostnames:
                # Named after its node: unique within the acquisition, readable in the UI.
                host = item.hostnames[n]
                out.append(_Slot(f"{prefix}-{host}", item, units, host))
            else:
                out.append(_Slot(f"{prefix}-{len(out):04d}", item, units))
    return out


def _user_data(slot: _Slot, kubelet_template: str | None) -> str | None:
    if slot.item.user_data is not None:
        return slot.item.user_data.replace("{hostname}", slot.hostname or slot.instance_id)
    if kubelet_template is not None:
        args = kubelet_join_args(slot.item.pool_id, slot.item.hall, slot.capacity_type.value)
        return kubelet_template.format(kubelet_args=" ".join(args))
    return None


@workflow.defn
class AcquisitionWorkflow:
    @workflow.init
    def __init__(self, inp: AcquisitionInput) -> None:
        self._inp = inp
        self._id = workflow.info().workflow_id
        self._budget = BudgetClient()
        self._tokens = PooledTokens(self._budget, inp.region)
        self._paused = False
        self._cancel: OperatorInput | None = None
        self._approval: ApprovalInput | None = None
        self._lock = asyncio.Lock()
        self._sweep: asyncio.Task[None] | None = None  # a cancel's deletes (see cancel)
        fb = inp.fallback
        fb_items = fb.items if fb else []
        self._progress = AcquisitionProgress(
            acquisition_id=self._id,
            region=inp.region,
            contract=inp.contract,
            state=AcquisitionState.RUNNING,
            requested_instances=sum(i.instances for i in inp.items)
            + sum(i.instances for i in fb_items),
            requested_units=sum(i.units for i in inp.items) + sum(i.units for i in fb_items),
            fallback_cost_per_hour=fb.cost_per_hour if fb else 0.0,
            fallback_reason=fb.reason if fb else "",
            pools=sorted({i.pool_id for i in inp.items} | {i.pool_id for i in fb_items}),
            halls=sorted({i.hall for i in inp.items} | {i.hall for i in fb_items}),
        )
        self._created: list[_Slot] = []  # slots with an instance at the provider
        self._active: set[str] = set()  # instance ids that reached ACTIVE

    # -- operator messages ---------------------------------------------------------------

    @workflow.signal(name=TOKENS_GRANTED_SIGNAL)
    def tokens_granted(self, grant: TokenGrant) -> None:
        self._budget.on_grant(grant)

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> AcquisitionProgress:
        return self._progress

    @named_update(PAUSE_UPDATE)
    async def pause(self, inp: OperatorInput) -> ControlAck:
        self._paused = True
        self._progress.paused_by = inp.operator
        await self._set_state(AcquisitionState.PAUSED)
        await self._operator_decision("paused", inp)
        return ControlAck(state=self._progress.state, message=f"paused by {inp.operator}")

    @pause.validator
    def _validate_pause(self, inp: OperatorInput) -> None:
        self._require_running("pause")

    @named_update(RESUME_UPDATE)
    async def resume(self, inp: OperatorInput) -> ControlAck:
        self._paused = False
        self._progress.paused_by = ""
        await self._set_state(self._running_state())
        await self._operator_decision("resumed", inp)
        return ControlAck(state=self._progress.state, message=f"resumed by {inp.operator}")

    @resume.validator
    def _validate_resume(self, inp: OperatorInput) -> None:
        if not self._paused:
            raise ApplicationError("not paused", type="InvalidState")

    @named_update(CANCEL_UPDATE)
    async def cancel(self, inp: OperatorInput) -> ControlAck:
        if self._cancel is not None:
            # Idempotent: a second cancel (a retried CLI call, a second operator) is told
            # what is under way; the first one's operator stays on the record.
            return ControlAck(
                state=AcquisitionState.CANCELLING,
                message=f"already cancelling (by {self._cancel.operator})",
            )
        self._cancel = inp
        self._paused = False
        if workflow.patched(PATCH_CANCEL_DELETES_AT_ONCE):
            # The deletes run beside the launches; the run waits for them before it ends.
            self._sweep = asyncio.ensure_future(self._delete_landed())
        if workflow.patched(PATCH_CANCEL_AT_ONCE):
            # Cancelling from the moment it is accepted: progress never says running again.
            await self._set_state(AcquisitionState.CANCELLING)
        return ControlAck(
            state=AcquisitionState.CANCELLING,
            message=f"cancelled by {inp.operator}: deleting {len(self._created)} instance(s)",
        )

    @cancel.validator
    def _validate_cancel(self, inp: OperatorInput) -> None:
        # A cancel already under way is accepted again (the handler answers "already").
        if self._progress.state in FINISHED:
            raise ApplicationError(
                f"acquisition is {self._progress.state.value}", type="InvalidState"
            )

    @named_update(APPROVE_FALLBACK_UPDATE)
    async def approve_fallback(self, inp: ApprovalInput) -> ControlAck:
        self._approval = inp
        verdict = "approved" if inp.approve else "declined"
        return ControlAck(
            state=self._progress.state, message=f"fallback {verdict} by {inp.approver}"
        )

    @approve_fallback.validator
    def _validate_approval(self, inp: ApprovalInput) -> None:
        if self._progress.fallback is not FallbackState.AWAITING_APPROVAL or self._approval:
            raise ApplicationError(
                f"no fallback is waiting for approval (fallback: {self._progress.fallback.value})",
                type="InvalidState",
            )

    def _running_state(self) -> AcquisitionState:
        if self._cancel is not None and workflow.patched(PATCH_CANCEL_AT_ONCE):
            return AcquisitionState.CANCELLING
        # An operator may pause before the run's first step (handlers run first).
        return AcquisitionState.PAUSED if self._paused else AcquisitionState.RUNNING

    def _require_running(self, what: str) -> None:
        if self._progress.state in FINISHED or self._cancel is not None:
            raise ApplicationError(
                f"cannot {what}: acquisition is {self._progress.state.value}", type="InvalidState"
            )
        if self._paused:
            raise ApplicationError(f"cannot {what}: already paused", type="InvalidState")

    # -- the run -------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: AcquisitionInput) -> AcquisitionResult:
        try:
            return await self._run(inp)
        except FailureError as exc:
            # An activity out of retries (fleet state down for minutes, a delete refused):
            # the acquisition fails, but never with instances it created left running.
            # Only a failing run asks for the patch, so histories that did not fail replay
            # unchanged.
            if self._sweep is not None:
                # A cancel's deletes end first: compensation deletes what they leave.
                with contextlib.suppress(FailureError):
                    await self._sweep
            if workflow.patched(PATCH_COMPENSATE):
                await self._compensate(exc)
            if workflow.patched(PATCH_FAILED_WAITS_HANDLERS):
                await workflow.wait_condition(workflow.all_handlers_finished)
            raise

    async def _run(self, inp: AcquisitionInput) -> AcquisitionResult:
        workflow.upsert_search_attributes(
            [
                sa.REGION.value_set(inp.region),
                sa.WORKLOAD.value_set(inp.contract),
                sa.HALL.value_set(self._progress.halls),
                sa.POOL.value_set(self._progress.pools),
                sa.REQUESTED.value_set(self._progress.requested_instances),
                sa.ACQUIRED.value_set(0),
            ]
        )
        await self._set_state(self._running_state())
        slots = _slots(self._id, inp.items)
        await self._launch_all(slots)
        if inp.fallback is not None and self._cancel is None:
            await self._fallback()
        if self._cancel is not None:
            if self._sweep is not None:
                await self._sweep
            await self._cancel_created()
            final = AcquisitionState.CANCELLED
        elif not inp.items and self._progress.fallback is FallbackState.DECLINED:
            final = AcquisitionState.DECLINED
        else:
            final = AcquisitionState.COMPLETED
        await self._set_state(final)
        count(
            "sco_acquisitions_finished",
            "Acquisitions by final state",
            region=inp.region,
            state=final.value,
        )
        outcome = (
            f"{self._progress.active} of {self._progress.requested_instances} active, "
            f"{self._progress.shortfall_units} units short"
        )
        cancel = self._cancel
        await self._decide(
            DecisionKind.ACQUISITION,
            final.value,
            reason=f"{cancel.reason}; {outcome}" if cancel and cancel.reason else outcome,
            actor=cancel.operator if cancel else "sco",
            identity=cancel.identity if cancel else "",
            units=self._progress.requested_units,
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        return AcquisitionResult(progress=self._progress, instance_ids=sorted(self._active))

    async def _launch_all(self, slots: list[_Slot]) -> None:
        gate = asyncio.Semaphore(self._inp.max_parallel)

        async def one(slot: _Slot) -> None:
            async with gate:
                await self._launch(slot)

        if slots:
            tasks = [asyncio.ensure_future(one(s)) for s in slots]
            await workflow.wait(tasks)
            # Every slot has run to its end (no create in flight); the first that failed
            # fails the acquisition, which then deletes what the others created.
            failed = [t.exception() for t in tasks if t.exception() is not None]
            if failed and workflow.patched(PATCH_COMPENSATE):
                raise failed[0]  # type: ignore[misc]

    async def _launch(self, slot: _Slot) -> None:
        inp = self._inp
        await workflow.wait_condition(lambda: not self._paused or self._cancel is not None)
        if self._cancel is not None:
            return
        await workflow.execute_activity_method(
            FleetActivities.record_acquire,
            RecordAcquireInput(
                spec=InstanceSpec(
                    instance_id=slot.instance_id,
                    region=inp.region,
                    pool_id=slot.item.pool_id,
                    capacity_type=slot.capacity_type,
                    workload=inp.contract,
                    tier=inp.tier,
                    acquisition_id=self._id,
                    price_per_hour=slot.item.price_per_hour,
                    hostname=slot.hostname,
                ),
                reason=f"acquisition {self._id}",
            ),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=STATE_RETRY,
        )
        request = CreateRequest(
            name=slot.instance_id,
            region=inp.region,
            pool_id=slot.item.pool_id,
            hall=slot.item.hall,
            flavor=slot.item.flavor,
            metadata={"sco-workload": inp.contract, "sco-acquisition": self._id}
            | ({HOSTNAME_KEY: slot.hostname} if slot.hostname else {}),
            reservation_id=slot.reservation_id,
            user_data=_user_data(slot, inp.kubelet_user_data),
        )
        attempt, tried, answered = 0, False, False
        started = workflow.now()
        give_up = timedelta(seconds=inp.build_timeout_seconds)
        while True:
            await workflow.wait_condition(lambda: not self._paused or self._cancel is not None)
            # Once a create went out it is seen through (to learn what to delete), unless
            # the provider answered that it made nothing: then it is not tried again.
            if self._cancel is not None and (
                not tried or (answered and workflow.patched(PATCH_CANCEL_DELETES_AT_ONCE))
            ):
                await self._fail(slot, "cancelled before create", shortfall=False)
                return
            if workflow.patched(PATCH_POOLED_TOKENS):
                await self._tokens.take()
            else:
                await self._budget.take(inp.region, 1)
            # The token may arrive long after it was asked for: a pause or cancel accepted
            # meanwhile holds this create back too (the token stays good for a resume).
            if not tried and workflow.patched(PATCH_CHECK_AFTER_TOKEN):
                await workflow.wait_condition(lambda: not self._paused or self._cancel is not None)
                if self._cancel is not None:
                    await self._fail(slot, "cancelled before create", shortfall=False)
                    return
            tried = True
            try:
                created = await workflow.execute_activity_method(
                    ProviderActivities.create_instance,
                    request,
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(maximum_attempts=1),
                )
                break
            except ActivityError as exc:
                # A lost create may have made the instance: retried until it answers (the
                # same name finds it), up to the build bound; past it the slot is given up
                # and the region's reconciler deletes whatever the create left.
                kind = error_type(exc)
                step = create_retry(
                    lost=lost(exc),
                    error_type=kind,
                    attempt=attempt,
                    max_attempts=inp.max_create_attempts,
                    elapsed=workflow.now() - started,
                    give_up=give_up,
                    retried=RETRIED_BY_US,
                )
                attempt = step.attempt
                answered = step.next in (CreateNext.RETRY, CreateNext.FAIL)
                if step.next is CreateNext.GIVE_UP_LOST and workflow.patched(PATCH_BOUNDED_CREATE):
                    await self._fail(slot, f"create: no answer in {give_up.total_seconds():.0f} s")
                    return
                if step.next is CreateNext.FAIL:
                    if step.capacity:
                        self._capacity_error(slot)
                    await self._fail(slot, f"create: {kind or 'error'}: {exc.cause or exc}")
                    return
                await workflow.sleep(timedelta(seconds=step.backoff_s))
                continue
        slot.provider_id = created.provider_id
        self._created.append(slot)
        self._progress.launched += 1
        slot.busy = True
        try:
            await self._boot(slot, created.provider_id, started, give_up)
        finally:
            slot.busy = False

    async def _boot(
        self, slot: _Slot, provider_id: str, started: datetime, give_up: timedelta
    ) -> None:
        """A created instance to ACTIVE and READY; deleted instead once cancelled."""
        inp = self._inp
        if self._cancelled_now():
            await self._delete_cancelled(slot)
            return
        try:
            slot.waiting = workflow.start_activity_method(
                ProviderActivities.wait_active,
                WaitActiveInput(
                    provider_id=provider_id,
                    poll_seconds=inp.poll_seconds,
                    build_deadline=started + give_up,
                ),
                start_to_close_timeout=timedelta(minutes=15),
                # The bound holds even if the activity's own check never runs (lost worker).
                schedule_to_close_timeout=give_up + timedelta(seconds=60),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(non_retryable_error_types=NOT_RETRIED),
            )
            await slot.waiting
        except ActivityError as exc:
            if self._cancelled_now():
                # Its boot was cancelled (see _delete_landed), or failed after the cancel.
                await self._delete_cancelled(slot)
                return
            kind = error_type(exc)
            if kind == "InsufficientCapacity":
                self._capacity_error(slot)
            # An instance that never became ACTIVE still holds its name and maybe a host.
            await self._delete(slot, fail=True, reason=f"boot: {kind or 'error'}")
            return
        finally:
            slot.waiting = None
        await self._record(slot, EventKind.READY, provider_id=provider_id)
        self._active.add(slot.instance_id)
        self._progress.active += 1
        count(
            "sco_instances_acquired",
            "Instances an acquisition brought to ACTIVE",
            region=self._inp.region,
            pool=slot.item.pool_id,
            capacity_type=slot.capacity_type.value,
        )
        workflow.upsert_search_attributes([sa.ACQUIRED.value_set(self._progress.active)])
        if self._cancelled_now():
            await self._delete_cancelled(slot)

    def _cancelled_now(self) -> bool:
        """Cancelled, and a cancel deletes at once (asks for the patch only once cancelled,
        so runs that were never cancelled replay unchanged)."""
        return self._cancel is not None and workflow.patched(PATCH_CANCEL_DELETES_AT_ONCE)

    async def _delete_landed(self) -> None:
        """A cancel's deletes, beside the launches: boots waited on are cancelled (their
        launches delete them), instances whose launch has ended are deleted now. Launches
        still at work delete theirs when they see the cancel."""
        for slot in self._created:
            if slot.waiting is not None:
                slot.waiting.cancel()
        for slot in list(self._created):
            if not slot.busy and slot.provider_id is not None:
                await self._delete_cancelled(slot)

    async def _delete_cancelled(self, slot: _Slot) -> None:
        assert self._cancel is not None
        why = f"cancelled by {self._cancel.operator}: {self._cancel.reason}".rstrip(": ")
        await self._delete(slot, fail=False, reason=why)
        if slot.instance_id in self._active:
            self._active.discard(slot.instance_id)
            self._progress.active -= 1
            workflow.upsert_search_attributes([sa.ACQUIRED.value_set(self._progress.active)])

    def _capacity_error(self, slot: _Slot) -> None:
        count(
            "sco_capacity_errors",
            "InsufficientCapacity answers per pool",
            region=self._inp.region,
            pool=slot.item.pool_id,
        )
        errors = self._progress.capacity_errors
        errors[slot.item.pool_id] = errors.get(slot.item.pool_id, 0) + 1

    async def _fail(self, slot: _Slot, reason: str, *, shortfall: bool = True) -> None:
        await self._record(slot, EventKind.FAIL, reason=reason)
        self._progress.failed += 1
        if shortfall:
            self._progress.shortfall_units += slot.units

    async def _delete(self, slot: _Slot, *, fail: bool, reason: str) -> None:
        assert slot.provider_id is not None
        await delete_instance(self._budget, self._inp.region, slot.provider_id)
        if fail:
            await self._fail(slot, reason)
        else:
            await self._record(slot, EventKind.DELETE, reason=reason)
            self._progress.deleted += 1
        slot.provider_id = None

    async def _record(
        self, slot: _Slot, kind: EventKind, *, reason: str = "", provider_id: str | None = None
    ) -> None:
        await workflow.execute_activity_method(
            FleetActivities.record_event,
            RecordEventInput(
                instance_id=slot.instance_id, kind=kind, reason=reason, provider_id=provider_id
            ),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=STATE_RETRY,
        )

    async def _cancel_created(self) -> None:
        await self._set_state(AcquisitionState.CANCELLING)
        assert self._cancel is not None
        why = f"cancelled by {self._cancel.operator}: {self._cancel.reason}".rstrip(": ")
        for slot in self._created:
            if slot.provider_id is not None:
                await self._delete(slot, fail=False, reason=why)
                if slot.instance_id in self._active:
                    self._active.discard(slot.instance_id)
                    self._progress.active -= 1
        workflow.upsert_search_attributes([sa.ACQUIRED.value_set(self._progress.active)])

    async def _compensate(self, exc: FailureError) -> None:
        """Delete every instance this run created, then record what can be recorded.

        The provider deletes come first and are retried until done (a token each): that is
        what stops the cost. The fleet-state writes after them are bounded and their
        failures tolerated, as the database may be why the acquisition failed."""
        why = f"compensation: acquisition failed: {exc.cause or exc}"
        self._progress.state = AcquisitionState.FAILED
        workflow.upsert_search_attributes([sa.STATE.value_set(AcquisitionState.FAILED.value)])
        for slot in self._created:
            if slot.provider_id is None:
                continue
            try:
                await delete_instance(self._budget, self._inp.region, slot.provider_id)
            except ActivityError as err:
                # Refused for good: the region's reconciler deletes it (its second net).
                workflow.logger.warning("compensation: delete %s: %s", slot.instance_id, err)
                continue
            slot.provider_id = None
            self._progress.deleted += 1
            if slot.instance_id in self._active:
                self._active.discard(slot.instance_id)
                self._progress.active -= 1
            with contextlib.suppress(ActivityError):
                await workflow.execute_activity_method(
                    FleetActivities.record_event,
                    RecordEventInput(
                        instance_id=slot.instance_id, kind=EventKind.DELETE, reason=why
                    ),
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=COMPENSATION_STATE_RETRY,
                )
        workflow.upsert_search_attributes([sa.ACQUIRED.value_set(self._progress.active)])
        with contextlib.suppress(ActivityError):
            await self._record_progress(AcquisitionState.FAILED, COMPENSATION_STATE_RETRY)

    # -- committed fallback --------------------------------------------------------------

    async def _fallback(self) -> None:
        plan = self._inp.fallback
        assert plan is not None
        if plan.needs_approval:
            self._progress.fallback = FallbackState.AWAITING_APPROVAL
            await self._set_state(AcquisitionState.WAITING_APPROVAL)
            await self._decide(
                DecisionKind.FALLBACK,
                "awaiting_approval",
                reason=plan.reason,
                amount=plan.cost_per_hour,
                units=plan.units,
            )
            # A timeout is the deadline passing: decided below as declined.
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._approval is not None or self._cancel is not None,
                    timeout=timedelta(seconds=self._inp.approval_timeout_seconds),
                )
            if self._cancel is not None:
                return
        verdict = fallback_verdict(
            needs_approval=plan.needs_approval,
            approval=self._approval,
            approval_timeout_s=self._inp.approval_timeout_seconds,
            plan_reason=plan.reason,
        )
        self._progress.fallback = verdict.state
        if not verdict.launch:
            self._progress.shortfall_units += plan.units
        if verdict.decided:
            self._progress.decided_by = verdict.actor
            self._progress.decision_reason = verdict.reason
        await self._decide(
            DecisionKind.FALLBACK,
            verdict.outcome,
            reason=verdict.reason,
            actor=verdict.actor,
            identity=verdict.identity,
            amount=plan.cost_per_hour,
            units=plan.units,
        )
        if plan.needs_approval:
            await self._set_state(self._running_state())
        if not verdict.launch:
            return
        items = [
            LaunchItem(
                pool_id=i.pool_id,
                hall=i.hall,
                flavor=i.flavor,
                instances=i.instances,
                units=i.units,
                capacity_type=CapacityType.COMMITTED,
                price_per_hour=i.price_per_hour,
            )
            for i in plan.items
        ]
        slots = _slots(f"{self._id}-c", items)
        by_item: dict[str, str | None] = {}
        for item in items:
            by_item[item.pool_id] = await self._reserve(item)
        ready: list[_Slot] = []
        for slot in slots:
            reservation = by_item[slot.item.pool_id]
            if reservation is None:
                self._capacity_error(slot)
                self._progress.shortfall_units += slot.units
                continue
            slot.reservation_id = reservation
            ready.append(slot)
        await self._launch_all(ready)

    async def _reserve(self, item: LaunchItem) -> str | None:
        """A Blazar reservation for the item's instances; None when the hall has no room."""
        now = workflow.now()
        request = ReservationRequest(
            name=lease_name(self._inp.region, item.hall, item.flavor, fallback_owner(self._id)),
            region=self._inp.region,
            hall=item.hall,
            flavor=item.flavor,
            amount=item.instances,
            end=now + timedelta(hours=self._inp.fallback_lease_hours),
        )
        res = await reserve(self._budget, request)
        return res.reservation_id if res else None

    # -- bookkeeping ---------------------------------------------------------------------

    async def _set_state(self, state: AcquisitionState) -> None:
        self._progress.state = state
        workflow.upsert_search_attributes([sa.STATE.value_set(state.value)])
        await self._record_progress(state, STATE_RETRY)

    async def _record_progress(self, state: AcquisitionState, retry: RetryPolicy) -> None:
        p = self._progress
        async with self._lock:
            await workflow.execute_activity_method(
                ControlActivities.record_acquisition,
                AcquisitionRecord(
                    acquisition_id=self._id,
                    region=self._inp.region,
                    workload=self._inp.contract,
                    partition=self._inp.partition,
                    state=state.value,
                    requested_units=p.requested_units,
                    requested_instances=p.requested_instances,
                    launched=p.launched,
                    active=p.active,
                    failed=p.failed,
                    shortfall_units=p.shortfall_units,
                    pool_ids=p.pools,
                    detail=f"fallback:{p.fallback.value}",
                ),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=retry,
            )

    async def _operator_decision(self, outcome: str, inp: OperatorInput) -> None:
        # Pause and resume became ledger decisions after acquisitions had run (and been
        # paused) in production: histories from before replay without the activity.
        if workflow.patched(OPERATOR_DECISIONS_PATCH):
            await self._decide(
                DecisionKind.ACQUISITION,
                outcome,
                reason=inp.reason,
                actor=inp.operator,
                identity=inp.identity,
            )

    async def _decide(
        self,
        kind: DecisionKind,
        outcome: str,
        *,
        reason: str,
        actor: str = "sco",
        identity: str = "",
        amount: float = 0.0,
        units: int = 0,
    ) -> None:
        await workflow.execute_activity_method(
            ControlActivities.record_decision,
            Decision(
                event_id=workflow.uuid4(),
                occurred_at=workflow.now(),
                region=self._inp.region,
                kind=kind,
                subject=self._inp.contract,
                outcome=outcome,
                actor=actor,
                identity=identity,
                reason=reason,
                amount_per_hour=amount,
                units=units,
                workflow_id=self._id,
            ),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=STATE_RETRY,
        )
