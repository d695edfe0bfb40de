"""BudgetClient: take tokens from a region's TokenBudgetWorkflow, inside another workflow.

Deterministic workflow code (no I/O of its own): it signals the budget, waits for the
budget's `tokens_granted` signal, and runs the `budget.ensure` activity when a request finds
no budget running (it starts one, then the request goes again). The requester wires the grant
signal to it:

    @workflow.defn
    class AcquisitionWorkflow:
        def __init__(self) -> None:
            self._budget = BudgetClient()

        @workflow.signal(name=TOKENS_GRANTED_SIGNAL)
        def tokens_granted(self, grant: TokenGrant) -> None:
            self._budget.on_grant(grant)

        ... granted = await self._budget.take(region, tokens=n)  # 1 <= granted <= n

Request ids are `<requester workflow id>#<n>`, n counting up from `start_counter`; a
requester that continues-as-new passes `counter` on, so the new run's ids are new to the
budget (which ignores ids it has seen). Do not continue-as-new with a take in flight:
its grant would arrive at the new run, which does not know the id, and be dropped.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.budget import (
        REQUEST_TOKENS_SIGNAL,
        TOKENS_GRANTED_SIGNAL,
        BudgetActivities,
        EnsureBudgetInput,
        SetRateInput,
        TokenGrant,
        TokenRequest,
        budget_workflow_id,
    )

__all__ = ["TOKENS_GRANTED_SIGNAL", "BudgetClient", "TokenGrant", "budget_workflow_id"]

NOT_FOUND = "ExternalWorkflowExecutionNotFound"
#: `workflow.patched` id: a requester signals the budget before ensuring it (runs that
#: began before ensured first; a patch id is per workflow, so every requester type has it).
PATCH_SIGNAL_FIRST = "budget-signal-first"
SEND_ATTEMPTS = 3


class BudgetClient:
    """The requester side of the budget protocol; one per requester workflow run.

    `activity_task_queue` is where `budget.ensure` runs (default: the requester's own
    task queue). `rates` gives the rate and burst to start some budgets with (by budget
    region key, e.g. `r1-probes`); the others start with the worker's default rate. A
    budget that runs already keeps the rate it has.
    """

    def __init__(
        self,
        *,
        start_counter: int = 0,
        activity_task_queue: str | None = None,
        ensure_timeout: timedelta = timedelta(seconds=30),
        rates: dict[str, SetRateInput] | None = None,
    ) -> None:
        self._counter = start_counter
        self._rates = dict(rates or {})
        self._activity_task_queue = activity_task_queue
        self._ensure_timeout = ensure_timeout
        self._ensured: set[str] = set()
        self._ensure_lock = asyncio.Lock()
        self._waiting: set[str] = set()
        self._grants: dict[str, TokenGrant] = {}

    @property
    def counter(self) -> int:
        """Requests made so far: pass it as `start_counter` across continue-as-new."""
        return self._counter

    @property
    def in_flight(self) -> int:
        """Takes waiting for a grant."""
        return len(self._waiting)

    def on_grant(self, grant: TokenGrant) -> None:
        """Call from the requester's `tokens_granted` signal handler."""
        if grant.request_id not in self._waiting:
            workflow.logger.warning(
                "grant of %d tokens for unknown or abandoned request %s dropped",
                grant.tokens,
                grant.request_id,
            )
            return
        self._grants.setdefault(grant.request_id, grant)

    async def take(self, region: str, tokens: int = 1, *, max_wait: timedelta | None = None) -> int:
        """Wait for between 1 and `tokens` tokens of `region`'s budget; return how many.

        Raises ApplicationError type "BudgetTimeout" after `max_wait` (the request stays
        queued and its tokens, when granted, are lost: conservative), "BudgetUnavailable"
        when the budget cannot be reached, "InvalidTokenRequest" when tokens < 1.
        """
        return (await self.take_grant(region, tokens, max_wait=max_wait)).tokens

    async def take_grant(
        self, region: str, tokens: int = 1, *, max_wait: timedelta | None = None
    ) -> TokenGrant:
        """`take`, returning the whole grant (with the budget's `granted_at`)."""
        if tokens < 1:
            raise ApplicationError(
                f"asked for {tokens} tokens", type="InvalidTokenRequest", non_retryable=True
            )
        self._counter += 1
        wf_id = workflow.info().workflow_id
        req = TokenRequest(
            requester_workflow_id=wf_id, request_id=f"{wf_id}#{self._counter}", tokens=tokens
        )
        self._waiting.add(req.request_id)
        try:
            await self._send(region, req)
            await workflow.wait_condition(
                lambda: req.request_id in self._grants,
                timeout=max_wait,
                timeout_summary=f"budget {region}" if max_wait is not None else None,
            )
        except TimeoutError:
            raise ApplicationError(
                f"no tokens from the {region} budget within {max_wait}", type="BudgetTimeout"
            ) from None
        finally:
            self._waiting.discard(req.request_id)
        return self._grants.pop(req.request_id)

    async def _send(self, region: str, req: TokenRequest) -> None:
        budget = workflow.get_external_workflow_handle(budget_workflow_id(region))
        # The region's budget runs for weeks: signal it first, and ensure (start) it only
        # when the signal finds none. Ensuring first cost every requester an activity and
        # a workflow task before its first request (decision 0042).
        attempts = SEND_ATTEMPTS
        if region not in self._ensured and workflow.patched(PATCH_SIGNAL_FIRST):
            self._ensured.add(region)
            attempts += 1  # the first signal was not one of the ensured attempts
        for _ in range(attempts):
            # Concurrent takes of one workflow share one ensure, not one each.
            async with self._ensure_lock:
                if region not in self._ensured:
                    rate = self._rates.get(region)
                    await workflow.execute_activity_method(
                        BudgetActivities.ensure,
                        EnsureBudgetInput(region=region)
                        if rate is None
                        else EnsureBudgetInput(
                            region=region, rate_per_second=rate.rate_per_second, burst=rate.burst
                        ),
                        task_queue=self._activity_task_queue,
                        start_to_close_timeout=self._ensure_timeout,
                    )
                    self._ensured.add(region)
            try:
                await budget.signal(REQUEST_TOKENS_SIGNAL, req)
                return
            except ApplicationError as err:
                if err.type != NOT_FOUND:
                    raise
                # Gone since we ensured it (terminated, say): ensure again. The budget never
                # saw this request, so sending the same id again is safe.
                workflow.logger.warning("budget %s not found, starting it again", budget.id)
                self._ensured.discard(region)
        raise ApplicationError(
            f"budget {budget.id} not found after {SEND_ATTEMPTS} attempts to start it",
            type="BudgetUnavailable",
        )
