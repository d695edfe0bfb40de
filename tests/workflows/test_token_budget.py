"""The region token budget: the bucket's invariant as a property, and TokenBudgetWorkflow
with real requester workflows on Temporal's time-skipping test server.

The invariant everywhere: over any window [t, t+T] of grant times, tokens granted <=
burst + rate*T. Checked on the budget's `granted_at` (the authoritative time the tokens
left the bucket); each requester also records its own `workflow.now()` on receipt.
"""

from __future__ import annotations

import contextlib
import math
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from tests.support.budget_workflows import (
    GrantRecord,
    GrantSink,
    PooledInput,
    PooledTakes,
    SinkInput,
    TakeInput,
    TakeOutput,
    TakeTokens,
)
from tests.support.wait import eventually_async

with workflow.unsafe.imports_passed_through():
    import pytest
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from activities.budget import (
        SET_RATE_SIGNAL,
        BudgetActivities,
        BudgetInput,
        BudgetStatus,
        EnsureBudgetInput,
        SetRateInput,
        TokenGrant,
        TokenRequest,
        budget_workflow_id,
    )
    from planning.token_bucket import EPSILON, TokenBucket
    from workflows.budget.workflow import TokenBudgetWorkflow

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def max_excess(grants: Sequence[tuple[datetime, int]], rate: float, burst: int) -> float:
    """max over windows [t_i, t_j] of granted - (burst + rate*T); <= 0 when the budget held."""
    grants = sorted(grants)
    prefix = [0]
    for _, n in grants:
        prefix.append(prefix[-1] + n)
    worst = -math.inf
    for i, (ti, _) in enumerate(grants):
        for j in range(i, len(grants)):
            span = (grants[j][0] - ti).total_seconds()
            worst = max(worst, prefix[j + 1] - prefix[i] - (burst + rate * span))
    return worst


# -- the bucket --------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(min_value=0.05, max_value=50),
    burst=st.integers(min_value=1, max_value=40),
    steps=st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=3, allow_nan=False),
            st.integers(min_value=0, max_value=60),
        ),
        max_size=80,
    ),
)
def test_the_bucket_never_grants_more_than_burst_plus_rate_times_t(
    rate: float, burst: int, steps: list[tuple[float, int]]
) -> None:
    bucket = TokenBucket.full(rate, burst, T0)
    now = T0
    grants: list[tuple[datetime, int]] = []
    for advance, wanted in steps:
        now += timedelta(seconds=advance)
        before = bucket.available(now)
        got = bucket.take(now, wanted)
        assert isinstance(got, int) and 0 <= got <= wanted
        assert got == min(wanted, math.floor(before + EPSILON))  # all it can, not less
        assert bucket.state.tokens >= 0
        grants.append((now, got))
        wait = bucket.seconds_until(now, 1)
        later = now + timedelta(microseconds=math.ceil(wait * 1e6))
        assert bucket.available(later) + EPSILON >= 1  # the promised token is there
    if grants:
        assert max_excess(grants, rate, burst) <= EPSILON * len(grants)


def test_the_bucket_starts_full_pauses_at_rate_zero_and_reconfigures() -> None:
    bucket = TokenBucket.full(2.0, 5, T0)
    assert bucket.take(T0, 100) == 5
    assert bucket.take(T0, 1) == 0
    assert bucket.seconds_until(T0, 1) == pytest.approx(0.5)
    assert bucket.seconds_until(T0, 99) == pytest.approx(2.5)  # capped at burst
    bucket.reconfigure(T0 + timedelta(seconds=1), 0.0, 3)  # 2 accrued at the old rate
    assert bucket.available(T0 + timedelta(hours=1)) == pytest.approx(2)
    assert bucket.seconds_until(T0 + timedelta(hours=1), 3) == math.inf
    assert bucket.take(T0 - timedelta(seconds=10), 5) == 2  # no refill backwards in time


# -- workflows used by the tests -----------------------------------------------------------


# -- harness ---------------------------------------------------------------------------------


@dataclass
class Budget:
    env: WorkflowEnvironment
    region: str
    queue: str
    ensured: list[str]

    @property
    def handle(self) -> WorkflowHandle[TokenBudgetWorkflow, None]:
        return self.env.client.get_workflow_handle_for(
            TokenBudgetWorkflow.run, budget_workflow_id(self.region)
        )

    async def status(self) -> BudgetStatus:
        return await self.handle.query(TokenBudgetWorkflow.status)

    async def start(self, **kw: object) -> WorkflowHandle[TokenBudgetWorkflow, None]:
        return await self.env.client.start_workflow(
            TokenBudgetWorkflow.run,
            BudgetInput.model_validate({"region": self.region, **kw}),
            id=budget_workflow_id(self.region),
            task_queue=self.queue,
        )

    async def requester(
        self, chunks: list[int], **kw: object
    ) -> WorkflowHandle[TakeTokens, TakeOutput]:
        inp = TakeInput.model_validate({"region": self.region, "chunks": chunks, **kw})
        return await self.env.client.start_workflow(
            TakeTokens.run, inp, id=f"take-{uuid.uuid4()}", task_queue=self.queue
        )


@asynccontextmanager
async def budget_worker(
    env: WorkflowEnvironment, *, rate: float = 10.0, burst: int = 20
) -> AsyncIterator[Budget]:
    """A worker with the budget, the test requesters and `budget.ensure` (which starts a
    budget with `rate` and `burst`, counting its calls); terminates the budget at the end."""
    b = Budget(env, f"rt{uuid.uuid4().hex[:8]}", f"tq-{uuid.uuid4()}", [])
    real = BudgetActivities(env.client, b.queue, rate_per_second=rate, burst=burst)

    @activity.defn(name="budget.ensure")
    async def ensure(inp: EnsureBudgetInput) -> None:
        b.ensured.append(inp.region)
        await real.ensure(inp)

    async with Worker(
        env.client,
        task_queue=b.queue,
        workflows=[TokenBudgetWorkflow, TakeTokens, GrantSink, PooledTakes],
        activities=[ensure],
    ):
        try:
            yield b
        finally:
            with contextlib.suppress(RPCError):  # never started, or already closed
                await b.handle.terminate("test over")


async def wait_for(check: Callable[[], Awaitable[bool]], what: str, within: float = 30) -> None:
    """Poll (in real time: time skipping only runs while a result is awaited)."""
    await eventually_async(check, timeout=within, what=what, every=0.05)


async def signal_current_run(b: Budget, request: TokenRequest) -> None:
    """Signal the budget's current run. The time-skipping test server answers "Completed
    workflow" to a signal that lands while a run is continuing as new (the real server hands
    it to one run or the other, never neither): this budget continues as new after every
    `continue_after_grants` grants, even when idle (seen in `make check` at load 20)."""
    for attempt in range(20):
        try:
            await b.handle.signal("request_tokens", request)
            return
        except RPCError as err:
            if "Completed workflow" not in str(err) or attempt == 19:
                raise


async def results(handles: Sequence[WorkflowHandle[TakeTokens, TakeOutput]]) -> list[TakeOutput]:
    """One at a time, on purpose: each `result()` on the time-skipping test server unlocks
    time skipping once, and with several unlocks at once (asyncio.gather) the server was
    seen skipping time while workflow tasks were in flight, straight to their 10 s task
    timeout. The requesters still run concurrently; only the waiting is sequential."""
    return [await h.result() for h in handles]


def merged(outputs: Sequence[TakeOutput]) -> list[GrantRecord]:
    return [g for out in outputs for g in out.grants]


def assert_rate_held(grants: Sequence[GrantRecord], rate: float, burst: int) -> None:
    """Exactly on the budget's clock; on the requesters' clocks, within what the delivery
    delay allows (a window of receipts holds grants made up to that delay earlier)."""
    assert max_excess([(g.granted_at, g.tokens) for g in grants], rate, burst) <= 1e-6
    delay = max((g.observed_at - g.granted_at).total_seconds() for g in grants)
    assert delay >= 0
    observed = [(g.observed_at, g.tokens) for g in grants]
    assert max_excess(observed, rate, burst) <= rate * delay + 1e-6


# -- the budget workflow ---------------------------------------------------------------------


async def test_one_requester_starts_the_budget_and_gets_every_token_at_the_rate(
    workflow_env: WorkflowEnvironment,
) -> None:
    async with budget_worker(workflow_env, rate=10.0, burst=20) as b:
        out = await (await b.requester([7] * 7 + [1])).result()
        assert sum(g.tokens for g in out.grants) == 50
        assert b.ensured == [b.region]  # the budget did not exist: ensure started it
        assert_rate_held(out.grants, 10.0, 20)
        # 20 go at once, the other 30 at 10/s.
        span = (out.grants[-1].granted_at - out.grants[0].granted_at).total_seconds()
        assert 3.0 - 1e-3 <= span <= 6.0
        assert len(out.grants) > 8  # some of the 8 chunks came in parts
        status = await b.status()
        assert (status.rate_per_second, status.burst) == (10.0, 20)
        assert status.granted_total == 50 and status.queued == 0
        assert status.requests_total == len(out.grants)


@pytest.mark.parametrize("seed", [20250101, 7])
async def test_concurrent_requesters_share_the_rate_and_all_finish(
    workflow_env: WorkflowEnvironment, seed: int
) -> None:
    rng = random.Random(seed)
    rate, burst = 5.0, 10
    plans = [
        [rng.randint(1, 6) for _ in range(rng.randint(2, 5))] for _ in range(rng.randint(5, 8))
    ]
    async with budget_worker(workflow_env, rate=rate, burst=burst) as b:
        handles = [await b.requester(chunks) for chunks in plans]
        outputs = await results(handles)
        for chunks, out in zip(plans, outputs, strict=True):
            assert sum(g.tokens for g in out.grants) == sum(chunks)
        grants = merged(outputs)
        assert_rate_held(grants, rate, burst)
        total = sum(map(sum, plans))
        status = await b.status()
        assert status.granted_total == total and status.queued == 0
        assert status.requests_total == len(grants)
        # High utilisation: nobody idles the bucket while others wait.
        times = sorted(g.granted_at for g in grants)
        assert (times[-1] - times[0]).total_seconds() <= (total - burst) / rate + 3.0
        # Each requester signals first and ensures only when no budget was running then
        # (budget-signal-first): the first always, the others as their timing fell.
        assert set(b.ensured) == {b.region} and 1 <= len(b.ensured) <= len(plans)


async def test_pooled_takes_ask_the_budget_once_for_a_burst(
    workflow_env: WorkflowEnvironment,
) -> None:
    """An acquisition's slots take their create tokens together (workflows/budget/
    pooled.py): 15 takes at once are one request for 15 tokens and one grant, not 15 of
    each (a burst of signals into one workflow stalls it in ~0.5 s steps)."""
    async with budget_worker(workflow_env, rate=10.0, burst=20) as b:
        out = await workflow_env.client.execute_workflow(
            PooledTakes.run,
            PooledInput(region=b.region, takes=15),
            id=f"pooled-{uuid.uuid4()}",
            task_queue=b.queue,
        )
        assert (out.served, out.held, out.requests) == (15, 0, 1)
        status = await b.status()
        assert (status.requests_total, status.granted_total, status.queued) == (1, 15, 0)


async def test_pooled_takes_short_of_tokens_are_served_in_turn_within_the_rate(
    workflow_env: WorkflowEnvironment,
) -> None:
    """A grant smaller than the takes waiting serves that many; the rest ask again,
    together. Every take gets exactly one token, none is left over, and the budget's
    rate holds (its grants stay within burst + rate x T)."""
    rate, burst = 2.0, 4
    async with budget_worker(workflow_env, rate=rate, burst=burst) as b:
        out = await workflow_env.client.execute_workflow(
            PooledTakes.run,
            PooledInput(region=b.region, takes=10),
            id=f"pooled-{uuid.uuid4()}",
            task_queue=b.queue,
        )
        assert (out.served, out.held) == (10, 0)
        status = await b.status()
        assert status.granted_total == 10 and status.queued == 0
        # The first request is for all 10 and gets the burst; later ones for what waits.
        assert 2 <= out.requests == status.requests_total < 10
        grants = []
        async for event in b.handle.fetch_history_events():
            if (
                event.event_type
                == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED
            ):
                attrs = event.signal_external_workflow_execution_initiated_event_attributes
                [grant] = await workflow_env.client.data_converter.decode(
                    attrs.input.payloads, [TokenGrant]
                )
                grants.append((grant.granted_at, grant.tokens))
        assert sum(n for _, n in grants) == 10 and grants[0][1] == burst
        assert max_excess(grants, rate, burst) <= 1e-6


async def continued_as_new_inputs(b: Budget, first_run_id: str) -> list[BudgetInput]:
    """The inputs each run of the budget handed to the next, oldest first."""
    inputs = []
    run_id: str | None = first_run_id
    while run_id:
        handle = b.env.client.get_workflow_handle(b.handle.id, run_id=run_id)
        run_id = None
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                attrs = event.workflow_execution_continued_as_new_event_attributes
                [inp] = await b.env.client.data_converter.decode(
                    attrs.input.payloads, [BudgetInput]
                )
                inputs.append(inp)
                run_id = attrs.new_execution_run_id
    return inputs


async def test_continue_as_new_carries_the_bucket_queue_and_seen_requests(
    workflow_env: WorkflowEnvironment,
) -> None:
    rate, burst = 5.0, 6
    async with budget_worker(workflow_env) as b:
        started = await b.start(rate_per_second=rate, burst=burst, continue_after_grants=4)
        handles = [await b.requester([3, 3, 3, 3]) for _ in range(3)]
        outputs = await results(handles)

        grants = merged(outputs)
        assert [sum(g.tokens for g in out.grants) for out in outputs] == [12, 12, 12]
        assert len({g.request_id for g in grants}) == len(grants)  # each grant once
        # Had a new run started with a full bucket, a burst would break the window.
        assert_rate_held(grants, rate, burst)

        carried = await continued_as_new_inputs(b, started.first_execution_run_id or "")
        assert len(carried) >= 2
        assert all(c.state is not None and c.state.tokens < burst for c in carried)
        assert any(c.queue for c in carried)  # waiting requests crossed a run boundary
        assert [c.granted_total for c in carried] == sorted(c.granted_total for c in carried)
        replayer = Replayer(workflows=[TokenBudgetWorkflow], data_converter=pydantic_data_converter)
        first_run = b.env.client.get_workflow_handle(
            b.handle.id, run_id=started.first_execution_run_id
        )
        await replayer.replay_workflow(await first_run.fetch_history())
        status = await b.status()
        assert status.granted_total == 36 and status.requests_total == len(grants)

        # A request granted in the first run, sent again to the last, is ignored; a new one
        # sent after it (signals are handled in order) is served.
        first = min(grants, key=lambda g: g.granted_at)
        requester_id = first.request_id.rsplit("#", 1)[0]
        assert requester_id in {h.id for h in handles}
        again = TokenRequest(
            requester_workflow_id=requester_id, request_id=first.request_id, tokens=3
        )
        await signal_current_run(b, again)
        sink = await b.env.client.start_workflow(
            GrantSink.run, SinkInput(expected=1), id=f"sink-{uuid.uuid4()}", task_queue=b.queue
        )
        fresh = TokenRequest(requester_workflow_id=sink.id, request_id="fresh", tokens=1)
        await signal_current_run(b, fresh)
        assert [g.request_id for g in await sink.result()] == ["fresh"]
        status = await b.status()
        assert status.requests_total == len(grants) + 1 and status.granted_total == 37


async def test_set_rate_takes_effect_at_once_and_status_reports_it(
    workflow_env: WorkflowEnvironment,
) -> None:
    async with budget_worker(workflow_env) as b:
        await b.start(rate_per_second=0.2, burst=2)
        status = await b.status()
        assert (status.rate_per_second, status.burst, status.tokens_available) == (0.2, 2, 2.0)

        taker = await b.requester([2, 3])

        async def waiting() -> bool:
            return (await b.status()).queued == 1

        await wait_for(waiting, "the second chunk to queue")
        status = await b.status()
        assert status.granted_total == 2 and status.queued_tokens == 3
        assert status.tokens_available < 1

        # Invalid settings do not decode, so the signal is dropped.
        await b.handle.signal(SET_RATE_SIGNAL, {"rate_per_second": -1, "burst": 0})
        await b.handle.signal(SET_RATE_SIGNAL, SetRateInput(rate_per_second=10, burst=4))
        out = await taker.result()

        # At 0.2/s the last 3 tokens would take 15 s; the budget woke up for the new rate.
        span = (out.grants[-1].granted_at - out.grants[0].granted_at).total_seconds()
        assert span < 3.0
        status = await b.status()
        assert (status.rate_per_second, status.burst) == (10.0, 4)
        assert status.granted_total == 5 and status.queued == 0


async def test_a_repeated_request_id_is_granted_once(workflow_env: WorkflowEnvironment) -> None:
    async with budget_worker(workflow_env) as b:
        await b.start(rate_per_second=1.0, burst=10)
        sink = await workflow_env.client.start_workflow(
            GrantSink.run, SinkInput(expected=2), id=f"sink-{uuid.uuid4()}", task_queue=b.queue
        )
        first = TokenRequest(requester_workflow_id=sink.id, request_id="a", tokens=3)
        second = TokenRequest(requester_workflow_id=sink.id, request_id="b", tokens=2)
        for req in [first, first, second, first.model_copy(update={"tokens": 5}), second]:
            await b.handle.signal("request_tokens", req)
        # The same id from another requester is another request.
        other = TokenRequest(requester_workflow_id="gone-requester", request_id="a", tokens=1)
        await b.handle.signal("request_tokens", other)

        grants = await sink.result()
        assert sorted((g.request_id, g.tokens) for g in grants) == [("a", 3), ("b", 2)]
        status = await b.status()
        # The grant to a requester that does not exist counts as spent.
        assert status.requests_total == 3 and status.granted_total == 6
        assert status.queued == 0


async def test_a_requester_restarts_a_budget_that_went_away(
    workflow_env: WorkflowEnvironment,
) -> None:
    async with budget_worker(workflow_env, rate=10.0, burst=20) as b:
        taker = await b.requester([2, 2], pause_before_chunk=1)

        async def paused() -> bool:
            return await taker.query(TakeTokens.chunk) == 1

        await wait_for(paused, "the first chunk")
        await b.handle.terminate("gone")
        await taker.signal(TakeTokens.resume)
        out = await taker.result()
        assert sum(g.tokens for g in out.grants) == 4
        assert b.ensured == [b.region, b.region]  # ensured again after "not found"
        assert (await b.status()).granted_total == 2  # the new run's count


async def test_a_requester_signals_a_running_budget_without_ensuring_it(
    workflow_env: WorkflowEnvironment,
) -> None:
    """The region's budget runs for weeks: a requester's first request is a signal, and
    `budget.ensure` (an activity and a workflow task more) runs only when that signal finds
    no budget (decision 0042). Its history has no activity at all."""
    async with budget_worker(workflow_env, rate=10.0, burst=20) as b:
        await b.start(rate_per_second=10.0, burst=20)
        taker = await b.requester([3])
        out = await taker.result()
        assert sum(g.tokens for g in out.grants) == 3
        assert b.ensured == []
        kinds = {e.event_type async for e in taker.fetch_history_events()}
        assert EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in kinds
        assert EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED not in kinds
