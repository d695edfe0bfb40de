"""LifecycleWorkflow: SCO's voluntary disruptions in one region, one path for all of them.

Id `lifecycle-<region>`. Every `interval_seconds` (300 s), or at once after a pause or
resume, one *round*: read a snapshot (activity `lifecycle.snapshot`: the bundle's
contracts, the instances SCO's controller and this workflow acquired, the contracts'
allowed reclaimable pools with their free capacity), ask the pure planner
(planning/lifecycle.py) what to replace, and replace it, all replacements of the round
concurrently; the next round starts when they are done, so what is in flight never
exceeds what the contract's disruption budget allowed.

Reasons: drift (the instance no longer conforms to its contract), return from fallback
(a committed fallback instance whose allowed reclaimable pools have had free capacity on
`stable_rounds` rounds and that is at least `min_age_seconds` old; replaced by one
instance as large, else by up to `max_return_parts` smaller ones), expiry (older than
the contract's `max_instance_age_hours`) and consolidation (one or two reclaimable
instances replaced by one that still covers the contract's demand and saves by
`consolidation_margin`, found on `consolidation_stable_rounds` rounds in a row). Each
reason is budgeted by the contract's `disruption` block and stopped by its blackouts. Hall-loss
rebuilds (the floor keeper) and reclaims (the notice relay) never come here and are never
blocked.

One replacement, make-before-break:
1. a DISRUPTION decision `replacing` (what, why, where to, the saving);
2. the replacement: a child AcquisitionWorkflow (id `life-<region>-<contract>-<nonce>`,
   ABANDON, recorded first under partition -2 so no controller counts it) booting every
   piece of it, waited for; not all ACTIVE: decision `held`, the old instance stays (the
   pieces that did come up are released);
3. the drain: the hall's notice relay is asked to notice the old instance (activity
   `lifecycle.tell_drain`, the request `sco reclaim --force` sends); its agent drains it
   by the contract's drain action before the deadline (notice + the region's lead).
   Not told (no relay answers, the instance is already leaving): the replacement is
   released instead, and the old instance stays (decision `held`): never a break
   without a drain;
4. at the deadline, the budgeted delete (`provider_calls.delete_instance`) and
   `record_release` (DELETE in fleet state, a release decision); a fallback's Blazar
   lease that nothing boots into any more is deleted too (activity
   `lifecycle.unused_fallback_leases`, then `provider_calls.delete_lease`), so the
   fallback spend stops with it; a consolidation's second instance is drained and
   deleted after the first (one disruption at a time); then decision `replaced` with
   the spend saved.

Operators pause and resume the region or one contract (signals `pause` / `resume`, `sco
lifecycle pause|resume`); replacements under way finish, none starts. Candidates held
back are recorded once per reason (decision `held`), not every round. Search attributes:
SCORegion, SCOState (watching, replacing, paused). Continue-as-new after
`rounds_per_run` rounds or `max_history_events` events, carrying pauses, the pools' free
streaks and consolidation streaks, what was recorded as held, the counters and the budget
counter.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from activities.budget import TOKENS_GRANTED_SIGNAL, TokenGrant
    from activities.control.activities import ControlActivities
    from activities.decisions import Decision, DecisionKind
    from activities.fleet.control_state import AcquisitionRecord
    from activities.lifecycle.activities import LifecycleActivities
    from activities.lifecycle.models import (
        LIFECYCLE_PARTITION,
        LIFECYCLE_PREFIX,
        DrainInput,
        DrainTold,
        FallbackLeaseInput,
        FallbackLeases,
        InstanceLookup,
        InstanceRef,
        LifecycleSnapshot,
        LifecycleSnapshotInput,
    )
    from contracts.disruption import DisruptionReason
    from planning.choice import ChoiceRecord
    from planning.lifecycle import (
        AntiChurn,
        ContractLife,
        Held,
        LifecyclePlan,
        LifeInstance,
        Replacement,
        next_consolidation_streak,
        next_streak,
        plan_lifecycle,
    )
    from workflows import search_attributes as sa
    from workflows.acquisition.models import (
        AcquisitionInput,
        AcquisitionState,
        LaunchItem,
    )
    from workflows.budget.client import BudgetClient
    from workflows.child_acquisition import gather, run_child_acquisition
    from workflows.lifecycle.models import (
        PAUSE_SIGNAL,
        RECENT,
        RESUME_SIGNAL,
        STATUS_QUERY,
        LifecycleInput,
        LifecycleState,
        LifecycleStatus,
        PauseInput,
        ReplacementRecord,
    )
    from workflows.metrics import count
    from workflows.provider_calls import (
        STATE_RETRY,
        delete_instance,
        delete_lease,
        record_release,
    )

T = TypeVar("T")

#: Return from fallback in several smaller instances (decision 0031): rounds recorded
#: before it planned one for one only.
PATCH_RETURN_IN_PARTS = "return-from-fallback-in-parts"
#: A returned fallback's lease deleted with its last instance (decision 0034): replacements
#: recorded before it left the lease to the reconciler.
PATCH_RELEASE_FALLBACK_LEASE = "release-fallback-lease"

_RETRY = RetryPolicy(maximum_attempts=10, maximum_interval=timedelta(seconds=30))


@workflow.defn
class LifecycleWorkflow:
    @workflow.init
    def __init__(self, inp: LifecycleInput) -> None:
        self._inp = inp
        self._cfg = inp.config
        self._id = workflow.info().workflow_id
        self._budget = BudgetClient(start_counter=inp.budget_counter)
        self._paused = inp.paused
        self._paused_contracts = set(inp.paused_contracts)
        self._streak = dict(inp.free_streak)
        self._consolidation_streak = dict(inp.consolidation_streak)
        self._undrainable = dict(inp.undrainable)
        self._held = dict(inp.held)
        self._in_flight: dict[str, str] = {}
        self._dirty = True  # a round at once after a start or continue-as-new
        self._decisions: list[Decision] = []  # from signal handlers, recorded by the loop
        self._status = LifecycleStatus(
            region=inp.region,
            state=LifecycleState.PAUSED if inp.paused else LifecycleState.WATCHING,
            rounds=inp.rounds,
            replaced=inp.replaced,
            saved_per_hour=inp.saved_per_hour,
            recent=list(inp.recent),
        )

    # -- messages ------------------------------------------------------------------------

    @workflow.signal(name=PAUSE_SIGNAL)
    def pause(self, inp: PauseInput) -> None:
        if inp.contract:
            if inp.contract in self._paused_contracts:
                return
            self._paused_contracts.add(inp.contract)
        elif self._paused:
            return
        else:
            self._paused = True
        self._decisions.append(self._operator_decision("paused", inp))
        self._dirty = True

    @workflow.signal(name=RESUME_SIGNAL)
    def resume(self, inp: PauseInput) -> None:
        if inp.contract:
            if inp.contract not in self._paused_contracts:
                return
            self._paused_contracts.discard(inp.contract)
        elif not self._paused:
            return
        else:
            self._paused = False
        self._decisions.append(self._operator_decision("resumed", inp))
        self._dirty = True

    @workflow.signal(name=TOKENS_GRANTED_SIGNAL)
    def tokens_granted(self, grant: TokenGrant) -> None:
        self._budget.on_grant(grant)

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> LifecycleStatus:
        """Read-only: a copy with the derived fields filled."""
        return self._status.model_copy(
            update={
                "paused": self._paused,
                "paused_contracts": sorted(self._paused_contracts),
                "in_flight": dict(sorted(self._in_flight.items())),
                "held": dict(sorted(self._held.items())),
                "undrainable": dict(sorted(self._undrainable.items())),
                "pending": self._dirty,
            },
            deep=True,
        )

    # -- the loop ------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: LifecycleInput) -> None:
        workflow.upsert_search_attributes(
            [sa.REGION.value_set(inp.region), sa.STATE.value_set(self._status.state.value)]
        )
        for _ in range(self._cfg.rounds_per_run):
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._dirty, timeout=timedelta(seconds=self._cfg.interval_seconds)
                )
            self._dirty = False
            await self._round()
            if self._history_full():
                break
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._flush_decisions()
        workflow.continue_as_new(
            inp.model_copy(
                update={
                    "paused": self._paused,
                    "paused_contracts": sorted(self._paused_contracts),
                    "free_streak": self._streak,
                    "consolidation_streak": self._consolidation_streak,
                    "undrainable": self._undrainable,
                    "held": self._held,
                    "rounds": self._status.rounds,
                    "replaced": self._status.replaced,
                    "saved_per_hour": self._status.saved_per_hour,
                    "recent": self._status.recent,
                    "budget_counter": self._budget.counter,
                }
            )
        )

    def _history_full(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self._cfg.max_history_events
        )

    def _set_state(self, state: LifecycleState, reason: str | None = None) -> None:
        if reason is not None:
            self._status.reason = reason
        if state is not self._status.state:
            self._status.state = state
            workflow.upsert_search_attributes([sa.STATE.value_set(state.value)])

    async def _round(self) -> None:
        await self._flush_decisions()
        self._status.rounds += 1
        if self._paused:
            self._set_state(LifecycleState.PAUSED, "paused by an operator")
            return
        try:
            snap: LifecycleSnapshot = await workflow.execute_activity_method(
                LifecycleActivities.snapshot,
                LifecycleSnapshotInput(region=self._inp.region),
                start_to_close_timeout=timedelta(seconds=120),
                retry_policy=_RETRY,
            )
        except ActivityError as exc:
            # Fleet state or the provider away for minutes: this round plans nothing, the
            # workflow lives on (a failed run would stop every voluntary replacement).
            self._set_state(LifecycleState.WATCHING, f"snapshot failed: {exc.cause}")
            return
        self._status.bundle_serial = snap.bundle_serial
        if snap.problem:
            self._set_state(LifecycleState.WATCHING, snap.problem)
            workflow.logger.warning("lifecycle %s: %s", self._id, snap.problem)
            return
        cfg = self._cfg
        now = workflow.now()
        self._undrainable = {h: t for h, t in self._undrainable.items() if t > now}
        self._streak = next_streak(self._streak, snap.contracts)
        plan = self._plan(snap.contracts, max_return_parts=1)
        if cfg.max_return_parts > 1 and any(
            h.reason is DisruptionReason.RETURN_FROM_FALLBACK for h in plan.held
        ):
            # A fallback held for want of one large instance may return in smaller ones.
            # Asked only when that changes the plan: histories before it replay unchanged.
            pieces = self._plan(snap.contracts, max_return_parts=cfg.max_return_parts)
            if pieces != plan and workflow.patched(PATCH_RETURN_IN_PARTS):
                plan = pieces
        self._consolidation_streak = next_consolidation_streak(self._consolidation_streak, plan)
        await self._record_held(plan.held)
        if not plan.replace:
            self._set_state(LifecycleState.WATCHING, "")
            return
        self._set_state(LifecycleState.REPLACING, "")
        views = {v.contract.name: v for v in snap.contracts}
        await gather([self._replace_or_log(r, views[r.contract]) for r in plan.replace])
        self._set_state(LifecycleState.WATCHING)

    def _plan(self, contracts: list[ContractLife], *, max_return_parts: int) -> LifecyclePlan:
        cfg = self._cfg
        return plan_lifecycle(
            contracts,
            now=workflow.now(),
            free_streak=self._streak,
            paused=self._paused_contracts,
            anti_churn=AntiChurn(
                min_age_seconds=cfg.min_age_seconds,
                stable_rounds=cfg.stable_rounds,
                min_saving_per_hour=cfg.min_saving_per_hour,
                consolidate=cfg.consolidate,
                consolidation_margin=cfg.consolidation_margin,
                max_return_parts=max_return_parts,
                # Rounds recorded before decision 0039 held a consolidation for
                # `stable_rounds`, as they replay.
                consolidation_stable_rounds=(
                    cfg.consolidation_stable_rounds
                    if workflow.patched("consolidation-stable-rounds")
                    else cfg.stable_rounds
                ),
            ),
            consolidation_streak=self._consolidation_streak,
            undrainable=set(self._undrainable),
        )

    async def _record_held(self, held: list[Held]) -> None:
        """A held-back candidate is recorded when it is first held, or held for another
        reason: the ledger says why, without a line every round."""
        now_held: dict[str, str] = {}
        for h in held:
            why = f"{h.reason.value}: {h.why}"
            now_held[h.instance_id] = why
            if self._held.get(h.instance_id) != why:
                await self._decide("held", why, subject=h.instance_id)
        self._held = now_held

    # -- one replacement -----------------------------------------------------------------

    async def _replace_or_log(self, r: Replacement, view: ContractLife) -> None:
        """One replacement; a step out of retries (fleet state away for minutes) ends it
        with a line in the status, not the workflow: the next round sees what is left."""
        try:
            await self._replace(r, view)
        except ActivityError as exc:
            workflow.logger.error("lifecycle: replacing %s failed: %s", r.instance_id, exc.cause)
            self._remember(r, "failed", f"{exc.cause}")

    async def _replace(self, r: Replacement, view: ContractLife) -> None:
        by_id = {i.instance_id: i for i in view.instances}
        olds = [by_id[x] for x in r.replaced]
        subject = r.instance_id
        for x in r.replaced:
            self._in_flight[x] = r.reason.value
        try:
            await self._decide(
                "replacing",
                f"{r.reason.value}: {r.why}; replacement in {_where(r)} at "
                f"{r.new_price_per_hour:.3f}/h (was {r.old_price_per_hour:.3f}/h)",
                subject=subject,
                units=r.new_units,
                amount_per_hour=r.new_price_per_hour,
            )
            new_ids = await self._launch(r, view)
            if len(new_ids) < len(r.parts):
                if new_ids:  # some pieces up, not all: make-before-break needs all of them
                    await self._release_replacement(r, new_ids, "not every piece became ACTIVE")
                    return
                await self._keep_old(
                    r,
                    f"the replacement in {r.pool_id} did not become ACTIVE",
                    f"{', '.join(r.replaced)} kept, tried again next round",
                )
                return
            new_id = ", ".join(new_ids)
            gone: list[LifeInstance] = []
            # One drain at a time: a consolidation disrupts one instance at once.
            for n, old in enumerate(olds):
                told = await self._tell_drain(r, old, new_id)
                if told.unavailable:
                    self._undrainable[old.hall] = workflow.now() + timedelta(
                        seconds=self._cfg.drain_retry_seconds
                    )
                if not told.told and n == 0:
                    await self._release_replacement(r, new_ids, told.why)
                    return
                if not told.told:
                    await self._decide(
                        "held",
                        f"{r.reason.value}: the drain of {old.instance_id} was not told "
                        f"({told.why}); kept beside {new_id}",
                        subject=old.instance_id,
                    )
                    continue
                noticed = told.noticed_at or workflow.now()
                wait = noticed + timedelta(seconds=told.lead_seconds) - workflow.now()
                if wait > timedelta(0):
                    await workflow.sleep(wait)
                await self._delete_old(r, old, new_id)
                gone.append(old)
            await self._replaced(r, gone, new_id)
        finally:
            for x in r.replaced:
                self._in_flight.pop(x, None)

    async def _launch(self, r: Replacement, view: ContractLife) -> list[str]:
        """The replacement's instances, every part in one child acquisition; the ids of
        those ACTIVE at its end (fewer than the parts: not all of it came up)."""
        inp = self._inp
        acq_id = f"{LIFECYCLE_PREFIX}{inp.region}-{r.contract}-{workflow.uuid4().hex[:8]}"
        items: dict[str, LaunchItem] = {}
        for part in r.parts:
            item = items.get(part.pool_id)
            if item is None:
                items[part.pool_id] = LaunchItem(
                    pool_id=part.pool_id,
                    hall=part.hall,
                    flavor=part.flavor,
                    instances=1,
                    units=part.units,
                )
            else:
                item.instances += 1
                item.units += part.units
        result = await run_child_acquisition(
            AcquisitionRecord(
                acquisition_id=acq_id,
                region=inp.region,
                workload=r.contract,
                partition=LIFECYCLE_PARTITION,
                state=AcquisitionState.STARTING.value,
                requested_units=r.new_units,
                requested_instances=len(r.parts),
                pool_ids=list(items),
                detail=f"lifecycle:{r.reason.value}:{r.instance_id}",
                choice=ChoiceRecord(
                    basis="lifecycle",
                    summary=f"{r.reason.value}: replacement for "
                    f"{', '.join(r.replaced)} in {_where(r)}: {r.why}",
                ),
            ),
            AcquisitionInput(
                region=inp.region,
                partition=LIFECYCLE_PARTITION,
                contract=r.contract,
                tier=view.tier,
                items=list(items.values()),
                poll_seconds=self._cfg.poll_seconds,
                build_timeout_seconds=self._cfg.build_timeout_seconds,
            ),
            record_retry=_RETRY,
            what="lifecycle",
        )
        if result is None or result.progress.active < 1:
            return []
        return list(result.instance_ids[: len(r.parts)])

    async def _tell_drain(self, r: Replacement, old: LifeInstance, new_id: str) -> DrainTold:
        try:
            told: DrainTold = await workflow.execute_activity_method(
                LifecycleActivities.tell_drain,
                DrainInput(
                    region=self._inp.region,
                    hall=old.hall,
                    instance_id=old.instance_id,
                    reason=f"lifecycle {r.reason.value}: replaced by {new_id}",
                ),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(
                    maximum_attempts=self._cfg.drain_attempts,
                    initial_interval=timedelta(seconds=2),
                    maximum_interval=timedelta(seconds=30),
                ),
            )
        except ActivityError as exc:
            cause = exc.cause
            why = cause.message if isinstance(cause, FailureError) else str(cause or exc)
            return DrainTold(told=False, why=why, unavailable=True)
        return told

    async def _release_replacement(self, r: Replacement, new_ids: list[str], why: str) -> None:
        """The drain was not told (or not every piece of the replacement came up): the old
        instance stays, its replacement goes (so the next round does not launch a second
        one beside it)."""
        for new_id in new_ids:
            ref: InstanceRef = await workflow.execute_activity_method(
                LifecycleActivities.instance,
                InstanceLookup(instance_id=new_id),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=STATE_RETRY,
            )
            if ref.found and ref.provider_id is not None:
                await delete_instance(self._budget, self._inp.region, ref.provider_id)
            if ref.found:
                await record_release(
                    region=self._inp.region,
                    instance_id=new_id,
                    subject=r.contract,
                    event_reason=f"lifecycle: drain of {r.instance_id} not told"
                    if len(new_ids) == len(r.parts)
                    else f"lifecycle: replacement of {r.instance_id} incomplete",
                    decision_reason=f"{new_id} released: the drain of {r.instance_id} was not "
                    f"told ({why})"
                    if len(new_ids) == len(r.parts)
                    else f"{new_id} released: {why}, {r.instance_id} kept",
                    price_per_hour=ref.price_per_hour,
                    at=workflow.now(),
                )
        ids = ", ".join(new_ids)
        if len(new_ids) < len(r.parts):
            await self._keep_old(
                r,
                f"{why} ({len(new_ids)} of {len(r.parts)})",
                f"{r.instance_id} kept, {ids} released, tried again next round",
            )
            return
        await self._keep_old(
            r,
            f"the drain of {r.instance_id} was not told ({why})",
            f"{r.instance_id} kept, its replacement {ids} released",
        )

    async def _keep_old(self, r: Replacement, why: str, kept: str) -> None:
        """The replacement did not happen (`why`); the old instance stays (`kept`)."""
        self._remember(r, "held", why)
        await self._decide("held", f"{r.reason.value}: {why}; {kept}", subject=r.instance_id)

    async def _delete_old(self, r: Replacement, old: LifeInstance, new_id: str) -> None:
        inp = self._inp
        if old.provider_id is not None:
            try:
                await delete_instance(self._budget, inp.region, old.provider_id)
            except ActivityError as exc:
                # The relay's sweep deletes what outlives its notice: it is not left behind.
                workflow.logger.warning("deleting %s: %s", old.instance_id, exc.cause)
        await record_release(
            region=inp.region,
            instance_id=old.instance_id,
            subject=r.contract,
            event_reason=f"lifecycle {r.reason.value}: replaced by {new_id}",
            decision_reason=f"{old.instance_id} ({old.pool_id}) replaced by {new_id} "
            f"({r.pool_id}): {r.reason.value}: {r.why}",
            price_per_hour=old.price_per_hour,
            at=workflow.now(),
            outcome="replaced",
        )
        if old.fallback and workflow.patched(PATCH_RELEASE_FALLBACK_LEASE):
            await self._release_fallback_lease(old)

    async def _release_fallback_lease(self, old: LifeInstance) -> None:
        """The fallback's Blazar lease, once nothing boots into it: deleted now (budgeted),
        so the committed spend stops with the instance. Not deleted (Blazar refusing for a
        while): the reconciler deletes the orphan later."""
        unused: FallbackLeases = await workflow.execute_activity_method(
            LifecycleActivities.unused_fallback_leases,
            FallbackLeaseInput(region=self._inp.region, instance_id=old.instance_id),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=STATE_RETRY,
        )
        for lease_id in unused.lease_ids:
            await delete_lease(self._budget, self._inp.region, lease_id)

    async def _replaced(self, r: Replacement, gone: list[LifeInstance], new_id: str) -> None:
        saving = sum(o.price_per_hour for o in gone) - r.new_price_per_hour
        ids = ", ".join(o.instance_id for o in gone)
        self._status.replaced += len(gone)
        self._status.saved_per_hour += saving
        self._remember(r, "replaced", r.why, replacement=new_id, saving=saving)
        count(
            "sco_voluntary_replacements",
            "Instances the lifecycle workflow replaced, by reason",
            len(gone),
            region=self._inp.region,
            reason=r.reason.value,
        )
        await self._decide(
            "replaced",
            f"{r.reason.value}: {ids} drained and deleted, {new_id} in {_where(r)} serves "
            f"instead; saves {saving:.3f}/h",
            subject=r.instance_id,
            units=r.new_units,
            amount_per_hour=r.new_price_per_hour,
        )

    def _remember(
        self,
        r: Replacement,
        outcome: str,
        why: str,
        *,
        replacement: str = "",
        saving: float = 0.0,
    ) -> None:
        rec = ReplacementRecord(
            contract=r.contract,
            instance_id=r.instance_id,
            reason=r.reason.value,
            outcome=outcome,
            why=why,
            at=workflow.now(),
            replacement=replacement,
            saving_per_hour=saving,
        )
        self._status.recent = [*self._status.recent, rec][-RECENT:]

    # -- decisions -----------------------------------------------------------------------

    def _operator_decision(self, outcome: str, inp: PauseInput) -> Decision:
        scope = inp.contract or "every contract"
        return Decision(
            event_id=workflow.uuid4(),
            occurred_at=workflow.now(),
            region=self._inp.region,
            kind=DecisionKind.DISRUPTION,
            subject=inp.contract or self._inp.region,
            outcome=outcome,
            actor=inp.operator,
            identity=inp.identity,
            reason=f"voluntary disruption {outcome} for {scope}"
            + (f": {inp.reason}" if inp.reason else ""),
            workflow_id=self._id,
        )

    async def _flush_decisions(self) -> None:
        while self._decisions:
            await self._record(self._decisions.pop(0))

    async def _decide(
        self,
        outcome: str,
        reason: str,
        *,
        subject: str,
        units: int = 0,
        amount_per_hour: float = 0.0,
    ) -> None:
        await self._record(
            Decision(
                event_id=workflow.uuid4(),
                occurred_at=workflow.now(),
                region=self._inp.region,
                kind=DecisionKind.DISRUPTION,
                subject=subject,
                outcome=outcome,
                reason=reason,
                units=units,
                amount_per_hour=amount_per_hour,
                workflow_id=self._id,
            )
        )

    async def _record(self, decision: Decision) -> None:
        await workflow.execute_activity_method(
            ControlActivities.record_decision,
            decision,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=_RETRY,
        )


def _where(r: Replacement) -> str:
    """Where the replacement runs: its pool, or each piece's."""
    return r.pool_id if not r.more else " + ".join(p.pool_id for p in r.parts)
