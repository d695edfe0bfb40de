"""PoolExclusionWorkflow: one per pool, forever; keeps reclaim-prone pools out of plans.

    ADMITTED --threshold notices in the window--> EXCLUDED --cool-down--> PROBING
    PROBING --canary ACTIVE, no notice for probe_seconds--> ADMITTED
    PROBING --capacity error or a notice during the probe--> EXCLUDED (strikes + 1)

Notices arrive as `reclaim_noticed` signals (signal-with-start, from whoever records a
NOTICE: `activities.exclusion.activities.notify_reclaim`), deduplicated by instance id; a safety net
counts the pool's NOTICE events in fleet state every `check_seconds`, in case a signal was
lost. Every state change is written to the `exclusions` row (which the planner reads: it
skips excluded and probing pools) and recorded as a Decision for the ledger.

The cool-down is base * 2**(strikes-1), +-20 % jitter, capped. A probe takes a token from
the region's probe budget (`token-budget-<region>-probes`, one canary per 30 s by default,
so pools excluded together are not all probed at once), then runs a one-instance child
AcquisitionWorkflow (`probe-<pool>-...`, which the region controller ignores), watches it,
and always deletes the canary, whatever the outcome.

Strikes survive a clean probe: a pool that misbehaves again soon after re-admission cools
down longer. They are forgiven after `strike_reset_seconds` admitted (a day by default),
and an operator's re-admission resets them.

Operators override the cycle at any point with the `exclude` and `readmit` updates; the
change applies at once and bumps an epoch, and cycle work already under way (a cool-down
timer, a probe) sees the epoch moved and gives up without deciding anything, deleting its
canary on the way out. `status` reads the whole state.

All state lives in one carried model; the workflow continues-as-new between phases (never
with a probe or a token request in flight) after `continue_after_events` or when the
server suggests it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from activities.budget import SetRateInput, TokenGrant
    from activities.control.activities import ControlActivities
    from activities.decisions import Decision, DecisionKind
    from activities.events import EventKind
    from activities.exclusion.activities import ExclusionActivities
    from activities.exclusion.models import (
        CANARY_WORKLOAD,
        CountNoticesInput,
        PoolRef,
        PoolState,
        SetStateInput,
    )
    from activities.fleet.activities import FleetActivities, RecordEventInput
    from planning import exclusion_policy as policy
    from workflows import search_attributes as sa
    from workflows.acquisition.models import AcquisitionInput, LaunchItem
    from workflows.acquisition.workflow import AcquisitionWorkflow
    from workflows.budget.client import BudgetClient
    from workflows.exclusion.models import (
        PROBE_PREFIX,
        ExclusionAck,
        ExclusionCarry,
        ExclusionInput,
        ExclusionStatus,
        OperatorExclude,
        OperatorReadmit,
        ReclaimNoticed,
        Transition,
        exclusion_workflow_id,
        probe_budget_key,
    )
    from workflows.metrics import count
    from workflows.provider_calls import delete_instance

__all__ = ["PoolExclusionWorkflow", "exclusion_workflow_id"]

#: Writes to fleet state: an entity that lives forever retries them for as long as it takes.
_DB_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=60))
HISTORY_LIMIT = 20
#: Co-reclaims count as one event (ExclusionConfig.burst_merge_seconds).
BURST_COUNTING_PATCH = "exclusion-burst-counting"


@workflow.defn
class PoolExclusionWorkflow:
    @workflow.init
    def __init__(self, inp: ExclusionInput) -> None:
        self._inp = inp
        self._cfg = inp.config
        self._s = inp.carry.model_copy(deep=True) if inp.carry else ExclusionCarry()
        self._budget = BudgetClient(
            start_counter=self._s.budget_counter,
            rates={
                probe_budget_key(inp.region): SetRateInput(
                    rate_per_second=self._cfg.probe_rate_per_second, burst=self._cfg.probe_burst
                )
            },
        )
        self._lock = asyncio.Lock()
        self._epoch = 0  # bumped by every transition: cycle work started before gives up
        self._wake = False  # a new notice came in
        self._events = 0
        self._next_check: datetime | None = None  # None: check at the first turn
        self._probe_since: datetime | None = None
        self._probe_dirty = ""
        self._probe_id = ""

    # -- messages ------------------------------------------------------------------------

    @workflow.signal(name="reclaim_noticed")
    def reclaim_noticed(self, inp: ReclaimNoticed) -> None:
        self._events += 1
        self._note(inp.instance_id, inp.at)

    @workflow.signal(name="tokens_granted")
    def tokens_granted(self, grant: TokenGrant) -> None:
        self._budget.on_grant(grant)

    @workflow.query
    def status(self) -> ExclusionStatus:
        s = self._s
        return ExclusionStatus(
            pool_id=self._inp.pool_id,
            region=self._inp.region,
            state=s.state,
            strikes=s.strikes,
            notices_in_window=self._in_window(),
            excluded_until=s.excluded_until,
            set_by=s.set_by,
            reason=s.reason,
            since=s.since,
            probe_id=self._probe_id,
            probes=s.probes,
            history=list(s.history),
        )

    @workflow.update
    async def exclude(self, inp: OperatorExclude) -> ExclusionAck:
        until = workflow.now() + timedelta(hours=inp.hours) if inp.hours is not None else None
        await self._transition(
            PoolState.EXCLUDED,
            actor=inp.operator,
            reason=inp.reason,
            until=until,
            identity=inp.identity,
        )
        when = f"until {until:%Y-%m-%d %H:%M} UTC, then probed" if until else "until re-admitted"
        return self._ack(f"excluded by {inp.operator} {when}")

    @exclude.validator
    def _validate_exclude(self, inp: OperatorExclude) -> None:
        _require_text(operator=inp.operator, reason=inp.reason)
        if inp.hours is not None and not inp.hours > 0:
            raise ApplicationError(f"hours must be > 0, got {inp.hours}", type="InvalidInput")

    @workflow.update
    async def readmit(self, inp: OperatorReadmit) -> ExclusionAck:
        done = await self._transition(
            PoolState.ADMITTED,
            actor=inp.operator,
            reason=inp.reason,
            identity=inp.identity,
            strikes=0,
            # Two re-admissions accepted at once: the second finds it done.
            unless=lambda: self._s.state is PoolState.ADMITTED,
        )
        return self._ack(f"re-admitted by {inp.operator}" if done else "already admitted")

    @readmit.validator
    def _validate_readmit(self, inp: OperatorReadmit) -> None:
        _require_text(operator=inp.operator, reason=inp.reason)
        if self._s.state is PoolState.ADMITTED:
            raise ApplicationError(f"{self._inp.pool_id} is already admitted", type="InvalidState")

    # -- the cycle -----------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: ExclusionInput) -> None:
        workflow.upsert_search_attributes(
            [
                sa.REGION.value_set(inp.region),
                sa.POOL.value_set([inp.pool_id]),
                sa.STATE.value_set(self._s.state.value),
            ]
        )
        if not self._s.adopted:
            await self._adopt()
        while not self._continue_due():
            self._events += 1
            if self._s.state is PoolState.ADMITTED:
                await self._admitted()
            elif self._s.state is PoolState.EXCLUDED:
                await self._excluded()
            else:
                await self._probe()
        await workflow.wait_condition(workflow.all_handlers_finished)
        now = workflow.now()
        carry = self._s.model_copy(
            update={
                "notices": policy.prune(self._s.notices, now, self._window),
                "budget_counter": self._budget.counter,
            }
        )
        workflow.continue_as_new(inp.model_copy(update={"carry": carry}))

    async def _adopt(self) -> None:
        """A fresh workflow takes over the pool's row: an exclusion outlives the workflow
        that made it (terminated, or its history lost)."""
        out = await workflow.execute_activity_method(
            ExclusionActivities.load_state,
            PoolRef(pool_id=self._inp.pool_id),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=_DB_RETRY,
        )
        self._s.adopted = True
        row = out.row
        if row is None or row.state is PoolState.ADMITTED:
            if row is not None and row.strikes:
                # Kept strikes are forgiven a clean period from now.
                self._s.strikes = row.strikes
                self._s.admitted_since = workflow.now()
            return
        until = row.excluded_until
        if until is None and row.set_by == "cycle":
            until = workflow.now()  # a cycle exclusion always ends in a probe
        # A probe that was running died with its workflow: the pool is probed again.
        await self._transition(
            PoolState.EXCLUDED,
            actor="sco",
            set_by=row.set_by,
            reason=f"adopted: {row.reason}",
            strikes=row.strikes,
            until=until,
        )

    async def _admitted(self) -> None:
        epoch = self._epoch
        self._wake = False
        now = workflow.now()
        if self._next_check is not None and now < self._next_check:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._wake or self._epoch != epoch or self._continue_due(),
                    timeout=self._next_check - now,
                )
        if self._epoch != epoch:
            return
        now = workflow.now()
        if self._next_check is None or now >= self._next_check:
            await self._safety_net()
            self._next_check = workflow.now() + timedelta(seconds=self._cfg.check_seconds)
            s = self._s
            if policy.strikes_forgiven(
                s.strikes,
                s.admitted_since,
                workflow.now(),
                timedelta(seconds=self._cfg.strike_reset_seconds),
            ):
                await self._forgive(epoch)
                return
        n, counted = self._reclaim_events()
        if policy.over_threshold(n, self._cfg.threshold):
            strikes = self._s.strikes + 1
            await self._transition(
                PoolState.EXCLUDED,
                actor="sco",
                reason=(
                    f"{n} {counted} within {self._cfg.window_seconds / 60:.0f} min "
                    f"(threshold {self._cfg.threshold})"
                ),
                strikes=strikes,
                until=workflow.now() + self._cooldown(strikes),
                epoch=epoch,
            )

    async def _excluded(self) -> None:
        epoch = self._epoch
        until = self._s.excluded_until
        now = workflow.now()
        if until is None or now < until:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._epoch != epoch or self._continue_due(),
                    timeout=until - now if until is not None else None,
                )
        if self._epoch != epoch or until is None or workflow.now() < until:
            return
        await self._transition(
            PoolState.PROBING,
            actor="sco",
            reason="cool-down over: probing with a canary",
            epoch=epoch,
        )

    async def _probe(self) -> None:
        inp, cfg = self._inp, self._cfg
        epoch = self._epoch
        self._probe_since = workflow.now()
        self._probe_dirty = ""
        # Probes of the whole region share one slow budget: no thundering herd of canaries
        # when a hall comes back and all its pools' cool-downs end together.
        await self._budget.take(probe_budget_key(inp.region), 1)
        if self._epoch != epoch:
            return
        probe_id = f"{PROBE_PREFIX}{inp.pool_id}-{workflow.uuid4().hex[:8]}"
        self._probe_id = probe_id
        self._s.probes += 1
        dirty = ""
        try:
            result = await workflow.execute_child_workflow(
                AcquisitionWorkflow.run,
                AcquisitionInput(
                    region=inp.region,
                    contract=CANARY_WORKLOAD,
                    tier=3,
                    items=[
                        LaunchItem(
                            pool_id=inp.pool_id,
                            hall=inp.hall,
                            flavor=inp.flavor,
                            instances=1,
                            units=1,
                        )
                    ],
                    max_create_attempts=3,
                ),
                id=probe_id,
            )
            p = result.progress
            if p.active < 1:
                dirty = (
                    "canary hit a capacity error"
                    if p.capacity_errors
                    else "canary never became active"
                )
        except ChildWorkflowError as exc:
            dirty = f"canary acquisition failed: {exc.cause or exc}"
        if not dirty and self._epoch == epoch:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: bool(self._probe_dirty) or self._epoch != epoch,
                    timeout=timedelta(seconds=cfg.probe_seconds),
                )
            if not self._probe_dirty and self._epoch == epoch:
                await self._safety_net()  # a notice whose signal was lost
        dirty = dirty or self._probe_dirty
        # Whatever happened, and whoever overrode the probe: the canary goes.
        await self._delete_canaries()
        self._probe_id = ""
        self._probe_since = None
        count(
            "sco_pool_probes",
            "Canary probes of excluded pools, by outcome",
            region=inp.region,
            outcome="dirty" if dirty else "clean",
        )
        if dirty:
            strikes = self._s.strikes + 1
            await self._transition(
                PoolState.EXCLUDED,
                actor="sco",
                reason=f"probe {probe_id}: {dirty}",
                strikes=strikes,
                until=workflow.now() + self._cooldown(strikes),
                epoch=epoch,
            )
        else:
            await self._transition(
                PoolState.ADMITTED,
                actor="sco",
                reason=f"probe {probe_id}: canary clean for {cfg.probe_seconds:.0f} s",
                epoch=epoch,
            )

    async def _delete_canaries(self) -> None:
        out = await workflow.execute_activity_method(
            ExclusionActivities.canaries,
            PoolRef(pool_id=self._inp.pool_id),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=_DB_RETRY,
        )
        for canary in out.canaries:
            if canary.provider_id is None:
                continue  # its create never answered: nothing to delete by id
            # Five attempts; a canary left behind is found and deleted by the next probe.
            await delete_instance(self._budget, self._inp.region, canary.provider_id, attempts=5)
            try:
                await workflow.execute_activity_method(
                    FleetActivities.record_event,
                    RecordEventInput(
                        instance_id=canary.instance_id,
                        kind=EventKind.DELETE,
                        reason=f"probe canary of {self._inp.pool_id} deleted",
                    ),
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=_DB_RETRY,
                )
            except ActivityError as exc:
                # InvalidTransition/UnknownInstance: someone else recorded its end.
                workflow.logger.warning("canary %s: %s", canary.instance_id, exc.cause)

    # -- notices -------------------------------------------------------------------------

    @property
    def _window(self) -> timedelta:
        return timedelta(seconds=self._cfg.window_seconds)

    def _in_window(self) -> int:
        return policy.count_in_window(
            self._s.notices, workflow.now(), self._window, self._s.counted_since
        )

    def _reclaim_events(self) -> tuple[int, str]:
        """What the threshold is held against, and what it counted. Histories from before
        burst counting keep counting every instance (the patch's old branch)."""
        if not workflow.patched(BURST_COUNTING_PATCH):
            return self._in_window(), "reclaim notices"
        merge = timedelta(seconds=self._cfg.burst_merge_seconds)
        n = policy.count_bursts(
            self._s.notices, workflow.now(), self._window, self._s.counted_since, merge
        )
        if not merge:
            return n, "reclaim notices"
        return n, f"reclaim events (notices within {merge.total_seconds():.0f} s count once)"

    def _note(self, instance_id: str, at: datetime) -> None:
        now = workflow.now()
        at = min(at, now)
        if not policy.add_notice(self._s.notices, instance_id, at, now, self._window):
            return
        self._wake = True
        if (
            self._s.state is PoolState.PROBING
            and self._probe_since is not None
            and at >= self._probe_since
            and not self._probe_dirty
        ):
            self._probe_dirty = f"reclaim notice for {instance_id} during the probe"

    async def _safety_net(self) -> None:
        out = await workflow.execute_activity_method(
            ExclusionActivities.count_notices,
            CountNoticesInput(
                region=self._inp.region,
                pool_id=self._inp.pool_id,
                window_seconds=self._cfg.window_seconds,
            ),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=_DB_RETRY,
        )
        now = workflow.now()
        for seen in out.notices:
            self._note(seen.instance_id, now - timedelta(seconds=seen.age_seconds))

    # -- transitions ---------------------------------------------------------------------

    def _cooldown(self, strikes: int) -> timedelta:
        cfg = self._cfg
        return policy.cooldown(
            strikes,
            base=timedelta(seconds=cfg.base_cooldown_seconds),
            cap=timedelta(seconds=cfg.max_cooldown_seconds),
            jitter=cfg.jitter,
            draw=workflow.random().random(),
        )

    async def _transition(
        self,
        to: PoolState,
        *,
        actor: str,
        reason: str,
        set_by: str | None = None,
        strikes: int | None = None,
        until: datetime | None = None,
        epoch: int | None = None,
        unless: Callable[[], bool] | None = None,
        identity: str = "",
    ) -> bool:
        """Move to `to`, write the row and record the decision; False when it did not
        happen: the cycle's `epoch` is stale (an operator got there first), or `unless`.

        State changes synchronously (queries and validators see it at once); the writes
        are serialised by the lock, so the row ends as the last transition left it."""
        async with self._lock:
            if (epoch is not None and epoch != self._epoch) or (unless and unless()):
                return False
            s, now = self._s, workflow.now()
            before = s.state
            s.state = to
            s.reason = reason
            s.set_by = set_by or ("cycle" if actor == "sco" else actor)
            if strikes is not None:
                s.strikes = strikes
            s.excluded_until = until if to is PoolState.EXCLUDED else None
            s.since = now
            if to is PoolState.ADMITTED:
                s.admitted_since = now
                s.counted_since = now  # the clean probe answered every notice before it
                self._next_check = now + timedelta(seconds=self._cfg.check_seconds)
            self._epoch += 1
            self._history(before, to, actor, reason)
            workflow.upsert_search_attributes([sa.STATE.value_set(to.value)])
            row = SetStateInput(
                pool_id=self._inp.pool_id,
                state=to,
                reason=reason,
                strikes=s.strikes,
                excluded_until=s.excluded_until,
                set_by=s.set_by,
            )
            outcome = {
                PoolState.EXCLUDED: "excluded",
                PoolState.PROBING: "probing",
                PoolState.ADMITTED: "readmitted",
            }[to]
            count(
                "sco_pool_exclusion_transitions",
                "Pool exclusion state changes, by new state",
                region=self._inp.region,
                state=to.value,
            )
            await self._write(row, outcome, actor, reason, identity)
            return True

    async def _forgive(self, epoch: int) -> None:
        async with self._lock:
            if epoch != self._epoch:
                return
            s = self._s
            reason = (
                f"admitted {self._cfg.strike_reset_seconds / 3600:.0f} h without exclusion: "
                f"{s.strikes} strike(s) forgiven"
            )
            s.strikes = 0
            self._history(s.state, s.state, "sco", reason)
            row = SetStateInput(
                pool_id=self._inp.pool_id,
                state=s.state,
                reason=s.reason,
                strikes=0,
                set_by=s.set_by,
            )
            await self._write(row, "strikes_reset", "sco", reason)

    def _history(self, before: PoolState, to: PoolState, actor: str, reason: str) -> None:
        s = self._s
        s.history.append(
            Transition(
                at=workflow.now(),
                from_state=before,
                to_state=to,
                strikes=s.strikes,
                actor=actor,
                reason=reason,
            )
        )
        del s.history[:-HISTORY_LIMIT]

    async def _write(
        self, row: SetStateInput, outcome: str, actor: str, reason: str, identity: str = ""
    ) -> None:
        await workflow.execute_activity_method(
            ExclusionActivities.set_state,
            row,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=_DB_RETRY,
        )
        await workflow.execute_activity_method(
            ControlActivities.record_decision,
            Decision(
                event_id=workflow.uuid4(),
                occurred_at=workflow.now(),
                region=self._inp.region,
                kind=DecisionKind.EXCLUSION,
                subject=self._inp.pool_id,
                outcome=outcome,
                actor=actor,
                identity=identity,
                reason=reason,
                workflow_id=workflow.info().workflow_id,
            ),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=_DB_RETRY,
        )

    # -- helpers -------------------------------------------------------------------------

    def _continue_due(self) -> bool:
        return (
            workflow.info().is_continue_as_new_suggested()
            or self._events >= self._cfg.continue_after_events
        )

    def _ack(self, message: str) -> ExclusionAck:
        s = self._s
        return ExclusionAck(
            state=s.state, strikes=s.strikes, excluded_until=s.excluded_until, message=message
        )


def _require_text(**fields: str) -> None:
    for name, value in fields.items():
        if not value.strip():
            raise ApplicationError(f"{name} must not be empty", type="InvalidInput")
