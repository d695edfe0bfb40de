"""PoolExclusionWorkflow: one per pool, forever; keeps reclaim-prone pools out of plans.

    ADMITTED --threshold notices in the window--> EXCLUDED --cool-down--> PROBING
    PROBING --canary ACTIVE, no notice for probe_seconds--> ADMITTED
    PROBING --capacity error or a notice during the probe--> EXCLUDED (strikes + 1)

Every decision (what a notice does, the threshold, the cool-down, the probe's verdict, an
override, forgiving strikes) is the state machine's in planning.exclusion_cycle, which the
estate simulator runs too; this workflow waits, writes and probes as its decisions say.

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
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from activities.budget import TOKENS_GRANTED_SIGNAL, SetRateInput, TokenGrant
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
    from planning.exclusion_cycle import CYCLE_ACTOR, ExclusionCycle, Forgive, Move, ProbeWatch
    from workflows import search_attributes as sa
    from workflows.acquisition.models import AcquisitionInput, LaunchItem
    from workflows.acquisition.workflow import AcquisitionWorkflow
    from workflows.budget.client import BudgetClient
    from workflows.exclusion.models import (
        EXCLUDE_UPDATE,
        PROBE_PREFIX,
        READMIT_UPDATE,
        RECLAIM_NOTICED_SIGNAL,
        STATUS_QUERY,
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
    from workflows.updates import named_update

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
        # Every decision of the cycle is the state machine's; this workflow waits, writes
        # and probes as its decisions say.
        self._cycle = ExclusionCycle(self._cfg.cycle_rules())
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
        self._watch: ProbeWatch | None = None  # the running probe
        self._probe_id = ""

    # -- messages ------------------------------------------------------------------------

    @workflow.signal(name=RECLAIM_NOTICED_SIGNAL)
    def reclaim_noticed(self, inp: ReclaimNoticed) -> None:
        self._events += 1
        self._note(inp.instance_id, inp.at)

    @workflow.signal(name=TOKENS_GRANTED_SIGNAL)
    def tokens_granted(self, grant: TokenGrant) -> None:
        self._budget.on_grant(grant)

    @workflow.query(name=STATUS_QUERY)
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

    @named_update(EXCLUDE_UPDATE)
    async def exclude(self, inp: OperatorExclude) -> ExclusionAck:
        until = workflow.now() + timedelta(hours=inp.hours) if inp.hours is not None else None
        await self._transition(
            self._cycle.on_operator_exclude(inp.operator, inp.reason, until),
            identity=inp.identity,
        )
        when = f"until {until:%Y-%m-%d %H:%M} UTC, then probed" if until else "until re-admitted"
        return self._ack(f"excluded by {inp.operator} {when}")

    @exclude.validator
    def _validate_exclude(self, inp: OperatorExclude) -> None:
        _require_text(operator=inp.operator, reason=inp.reason)
        if inp.hours is not None and not inp.hours > 0:
            raise ApplicationError(f"hours must be > 0, got {inp.hours}", type="InvalidInput")

    @named_update(READMIT_UPDATE)
    async def readmit(self, inp: OperatorReadmit) -> ExclusionAck:
        # Two re-admissions accepted at once: the second finds it done.
        done = await self._transition(
            self._cycle.on_operator_readmit(inp.operator, inp.reason), identity=inp.identity
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
                "notices": policy.prune(self._s.notices, now, self._cycle.rules.window),
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
        if row is None:
            return
        move = self._cycle.on_adopt(
            self._s,
            workflow.now(),
            state=row.state,
            strikes=row.strikes,
            until=row.excluded_until,
            set_by=row.set_by,
            reason=row.reason,
        )
        if move is not None:
            await self._transition(move)

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
            forgive = self._cycle.on_check(self._s, workflow.now())
            if forgive is not None:
                await self._forgive(forgive, epoch)
                return
        # Histories from before burst counting count every instance (the patch's old branch).
        burst_counting = workflow.patched(BURST_COUNTING_PATCH)
        move = self._cycle.on_count(self._s, workflow.now(), _draw, burst_counting=burst_counting)
        if move is not None:
            await self._transition(move, epoch=epoch)

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
        if self._epoch != epoch:
            return
        move = self._cycle.on_cooldown_over(self._s, workflow.now())
        if move is not None:
            await self._transition(move, epoch=epoch)

    async def _probe(self) -> None:
        inp, cfg = self._inp, self._cfg
        epoch = self._epoch
        probe = self._watch = ProbeWatch(since=workflow.now())
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
                    lambda: bool(probe.dirty) or self._epoch != epoch,
                    timeout=timedelta(seconds=cfg.probe_seconds),
                )
            if not probe.dirty and self._epoch == epoch:
                await self._safety_net()  # a notice whose signal was lost
        dirty = dirty or probe.dirty
        # Whatever happened, and whoever overrode the probe: the canary goes.
        await self._delete_canaries()
        self._probe_id = ""
        self._watch = None
        count(
            "sco_pool_probes",
            "Canary probes of excluded pools, by outcome",
            region=inp.region,
            outcome="dirty" if dirty else "clean",
        )
        await self._transition(
            self._cycle.on_probe_over(self._s, probe_id, dirty, workflow.now(), _draw),
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

    def _in_window(self) -> int:
        return self._cycle.in_window(self._s, workflow.now())

    def _note(self, instance_id: str, at: datetime) -> None:
        if self._cycle.on_notice(self._s, instance_id, at, workflow.now(), self._watch):
            self._wake = True

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

    async def _transition(
        self, move: Move, *, epoch: int | None = None, identity: str = ""
    ) -> bool:
        """Make the cycle's (or an operator's) move, write the row and record the decision;
        False when it did not happen: the cycle's `epoch` is stale (an operator got there
        first), or the move had nothing to do.

        State changes synchronously (queries and validators see it at once); the writes
        are serialised by the lock, so the row ends as the last transition left it."""
        async with self._lock:
            if epoch is not None and epoch != self._epoch:
                return False
            s, now = self._s, workflow.now()
            before = s.state
            if not self._cycle.apply(s, move, now):
                return False
            to, actor, reason = move.to, move.actor, move.reason
            if to is PoolState.ADMITTED:
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

    async def _forgive(self, forgive: Forgive, epoch: int) -> None:
        async with self._lock:
            if epoch != self._epoch:
                return
            s, reason = self._s, forgive.reason
            self._cycle.forgive(s, forgive)
            self._history(s.state, s.state, CYCLE_ACTOR, reason)
            row = SetStateInput(
                pool_id=self._inp.pool_id,
                state=s.state,
                reason=s.reason,
                strikes=0,
                set_by=s.set_by,
            )
            await self._write(row, "strikes_reset", CYCLE_ACTOR, reason)

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


def _draw(_strikes: int) -> float:
    """The cool-down's jitter draw: replayed from the workflow's seeded random."""
    return workflow.random().random()


def _require_text(**fields: str) -> None:
    for name, value in fields.items():
        if not value.strip():
            raise ApplicationError(f"{name} must not be empty", type="InvalidInput")
