"""TokenBudgetWorkflow: one durable token bucket per region for mutating OpenStack calls.

Every region's OpenStack API has a rate budget for mutating calls (server create/delete,
reservation create/extend/delete), and many acquisition workflows spend it at once. The
budget is one long-lived entity workflow per region, id `token-budget-<region>`, on the
region's task queue, holding a token bucket evaluated on workflow time.

Why an entity workflow, not a database row or an in-memory limiter:
- durable: the bucket, the queue and the idempotency keys are workflow state, so a worker
  crash or deploy loses nothing, and replay rebuilds the same state because the bucket
  runs on `workflow.now()` (never the wall clock);
- shared: every worker replica's workflows talk to the same one execution, where an
  in-process limiter would give each replica its own budget;
- fair: requests queue FIFO in one place, where a row polled by many callers rewards
  whoever polls fastest;
- no extra infrastructure: Temporal already runs; a row would need polling, locking and
  leases, and a caller that dies while holding a lock.

Why signals: workflows cannot send updates to, or query, other workflows, so the protocol
is the one of samples-python `resource_pool`. A requester signals `request_tokens`
(TokenRequest); the budget queues it and, when the bucket allows, signals
`tokens_granted` (TokenGrant) back. A grant holds min(wanted, whole tokens available) as
soon as one token is there, so a big request never holds back the small ones behind it
and the bucket never idles while someone waits; the requester asks again for the rest,
at the back of the queue. A repeated (requester, request_id) is ignored, so a request
that is sent again never gets tokens twice. A grant that cannot be delivered (the
requester is gone or closed) is logged and counts as spent: the API calls it allowed may
have happened.

No asyncio.Lock: every handler is synchronous, so no two can interleave; the only await
points are in the run loop, which pops a request before awaiting its delivery.

Continue-as-new when the server suggests it or after `continue_after_grants` grants,
once handlers are finished, carrying the bucket (tokens and time, so a new run does not
start full), the queue, the recent idempotency keys and the counters.

Restarting the budget (terminate, then a requester's ensure) starts a full bucket: the
one place where more than burst + rate*T can go out, by at most one burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from activities.budget import (
        BUDGET_WORKFLOW_TYPE,
        REQUEST_TOKENS_SIGNAL,
        SET_RATE_SIGNAL,
        STATUS_QUERY,
        TOKENS_GRANTED_SIGNAL,
        BudgetInput,
        BudgetStatus,
        SetRateInput,
        TokenGrant,
        TokenRequest,
    )
    from planning.token_bucket import TokenBucket
    from workflows import search_attributes

# The messages are re-exported: requesters may import them from here or from activities.budget.
__all__ = [
    "BudgetInput",
    "BudgetStatus",
    "SetRateInput",
    "TokenBudgetWorkflow",
    "TokenGrant",
    "TokenRequest",
]

SEEN_LIMIT = 4096
"""Idempotency keys of granted requests kept (and carried over), oldest dropped first.
Queued requests are always known; a repeat of a request granted more than SEEN_LIMIT
grants ago would be served again."""

RequestKey = tuple[str, str]


def _key(req: TokenRequest) -> RequestKey:
    return (req.requester_workflow_id, req.request_id)


def _timer(seconds: float) -> timedelta:
    """Whole milliseconds, rounded up (Temporal timers have millisecond resolution)."""
    return timedelta(milliseconds=max(1, math.ceil(seconds * 1000)))


@workflow.defn(name=BUDGET_WORKFLOW_TYPE)
class TokenBudgetWorkflow:
    @workflow.init
    def __init__(self, inp: BudgetInput) -> None:
        self._region = inp.region
        self._bucket = (
            TokenBucket(inp.state)
            if inp.state is not None
            else TokenBucket.full(inp.rate_per_second, inp.burst, workflow.now())
        )
        self._queue: deque[TokenRequest] = deque(inp.queue)
        self._queued: set[RequestKey] = {_key(r) for r in inp.queue}
        self._seen: dict[RequestKey, None] = dict.fromkeys(inp.seen)  # ordered, oldest first
        self._continue_after_grants = inp.continue_after_grants
        self._granted_total = inp.granted_total
        self._requests_total = inp.requests_total
        self._run_grants = 0
        self._config_version = 0  # bumped by set_rate to wake a refill wait

    @workflow.run
    async def run(self, inp: BudgetInput) -> None:
        workflow.upsert_search_attributes([search_attributes.REGION.value_set(self._region)])
        while not self._should_continue_as_new():
            await self._serve()
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.logger.info(
            "budget %s: continuing as new after %d grants, %d queued",
            self._region,
            self._run_grants,
            len(self._queue),
        )
        workflow.continue_as_new(self._carry_over())

    @workflow.signal(name=REQUEST_TOKENS_SIGNAL)
    def request_tokens(self, req: TokenRequest) -> None:
        key = _key(req)
        if key in self._queued or key in self._seen:
            workflow.logger.info(
                "budget %s: ignoring repeated request %s from %s",
                self._region,
                req.request_id,
                req.requester_workflow_id,
            )
            return
        self._queue.append(req)
        self._queued.add(key)
        self._requests_total += 1

    @workflow.signal(name=SET_RATE_SIGNAL)
    def set_rate(self, inp: SetRateInput) -> None:
        self._bucket.reconfigure(workflow.now(), inp.rate_per_second, inp.burst)
        self._config_version += 1
        workflow.logger.info(
            "budget %s: rate %s/s, burst %d", self._region, inp.rate_per_second, inp.burst
        )

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> BudgetStatus:
        return BudgetStatus(
            region=self._region,
            rate_per_second=self._bucket.rate_per_second,
            burst=self._bucket.burst,
            tokens_available=self._bucket.available(workflow.now()),
            queued=len(self._queue),
            granted_total=self._granted_total,
            requests_total=self._requests_total,
            queued_tokens=sum(r.tokens for r in self._queue),
        )

    def _should_continue_as_new(self) -> bool:
        return (
            self._run_grants >= self._continue_after_grants
            or workflow.info().is_continue_as_new_suggested()
        )

    async def _serve(self) -> None:
        """One step: wait for a request, grant what the bucket allows, or wait for tokens."""
        if not self._queue:
            await workflow.wait_condition(
                lambda: bool(self._queue) or self._should_continue_as_new()
            )
            return
        now = workflow.now()
        grants = self._grant_from_queue(now)
        if grants:
            await self._deliver_all(grants)
            return
        delay = self._bucket.seconds_until(now, 1)
        version = self._config_version

        def woken() -> bool:
            return self._config_version != version or self._should_continue_as_new()

        if math.isinf(delay):  # paused: only set_rate (or continue-as-new) moves us on
            await workflow.wait_condition(woken)
            return
        with contextlib.suppress(TimeoutError):  # the timer is the usual way out
            await workflow.wait_condition(woken, timeout=_timer(delay), timeout_summary="refill")

    def _grant_from_queue(self, now: datetime) -> list[tuple[TokenRequest, TokenGrant]]:
        """Grant to the queue's head, then the next, while whole tokens remain."""
        grants = []
        while self._queue:
            tokens = self._bucket.take(now, self._queue[0].tokens)
            if tokens == 0:
                break
            req = self._queue.popleft()
            key = _key(req)
            self._queued.discard(key)
            self._remember(key)
            self._granted_total += tokens
            self._run_grants += 1
            grants.append(
                (req, TokenGrant(request_id=req.request_id, tokens=tokens, granted_at=now))
            )
        return grants

    async def _deliver_all(self, grants: list[tuple[TokenRequest, TokenGrant]]) -> None:
        tasks = [asyncio.create_task(self._deliver(req, grant)) for req, grant in grants]
        await workflow.wait(tasks)
        for task in tasks:
            task.result()  # _deliver handles delivery failures; anything else is a bug

    async def _deliver(self, req: TokenRequest, grant: TokenGrant) -> None:
        requester = workflow.get_external_workflow_handle(req.requester_workflow_id)
        try:
            await requester.signal(TOKENS_GRANTED_SIGNAL, grant)
        except FailureError as err:  # the requester is gone or closed
            workflow.logger.warning(
                "budget %s: %d tokens for %s could not reach %s, counted as spent: %s",
                self._region,
                grant.tokens,
                grant.request_id,
                req.requester_workflow_id,
                err,
            )

    def _remember(self, key: RequestKey) -> None:
        self._seen[key] = None
        while len(self._seen) > SEEN_LIMIT:
            del self._seen[next(iter(self._seen))]

    def _carry_over(self) -> BudgetInput:
        state = self._bucket.state
        return BudgetInput(
            region=self._region,
            rate_per_second=state.rate_per_second,
            burst=state.burst,
            state=state,
            queue=list(self._queue),
            seen=list(self._seen),
            continue_after_grants=self._continue_after_grants,
            granted_total=self._granted_total,
            requests_total=self._requests_total,
        )
