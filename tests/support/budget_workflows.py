"""Requester workflows for the token budget tests, in a module of their own: the workflow
sandbox re-imports the module a workflow is defined in, and a test module's imports
(pytest, hypothesis) do not belong in the sandbox."""

from __future__ import annotations

import asyncio
from datetime import datetime

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.budget import TOKENS_GRANTED_SIGNAL, TokenGrant
    from workflows.budget.client import BudgetClient
    from workflows.budget.pooled import PooledTokens


class TakeInput(BaseModel):
    region: str
    chunks: list[int]
    pause_before_chunk: int | None = None
    """Wait for the `resume` signal before taking this chunk."""


class GrantRecord(BaseModel):
    request_id: str
    tokens: int
    granted_at: datetime
    observed_at: datetime


class TakeOutput(BaseModel):
    grants: list[GrantRecord]


@workflow.defn
class TakeTokens:
    """Takes each chunk in full, however many grants that needs."""

    def __init__(self) -> None:
        self._budget = BudgetClient()
        self._resumed = False
        self._chunk = 0

    @workflow.signal(name=TOKENS_GRANTED_SIGNAL)
    def tokens_granted(self, grant: TokenGrant) -> None:
        self._budget.on_grant(grant)

    @workflow.signal
    def resume(self) -> None:
        self._resumed = True

    @workflow.query
    def chunk(self) -> int:
        return self._chunk

    @workflow.run
    async def run(self, inp: TakeInput) -> TakeOutput:
        out = []
        for i, chunk in enumerate(inp.chunks):
            self._chunk = i
            if i == inp.pause_before_chunk:
                await workflow.wait_condition(lambda: self._resumed)
            left = chunk
            while left > 0:
                grant = await self._budget.take_grant(inp.region, left)
                assert 1 <= grant.tokens <= left
                left -= grant.tokens
                out.append(GrantRecord(**grant.model_dump(), observed_at=workflow.now()))
        return TakeOutput(grants=out)


class SinkInput(BaseModel):
    expected: int


@workflow.defn
class GrantSink:
    """Collects every grant sent to it: `expected` of them, then whatever comes in 10 s."""

    def __init__(self) -> None:
        self._grants: list[TokenGrant] = []

    @workflow.signal(name=TOKENS_GRANTED_SIGNAL)
    def tokens_granted(self, grant: TokenGrant) -> None:
        self._grants.append(grant)

    @workflow.run
    async def run(self, inp: SinkInput) -> list[TokenGrant]:
        await workflow.wait_condition(lambda: len(self._grants) >= inp.expected)
        await workflow.sleep(10)
        return self._grants


class PooledInput(BaseModel):
    region: str
    takes: int


class PooledOutput(BaseModel):
    served: int
    """Takes that got their token."""
    held: int
    """Tokens granted and never handed to a take."""
    requests: int
    """Requests this workflow sent the budget."""


@workflow.defn
class PooledTakes:
    """`takes` concurrent takes of one token each through PooledTokens (as an acquisition's
    slots take theirs)."""

    def __init__(self) -> None:
        self._budget = BudgetClient()
        self._served = 0

    @workflow.signal(name=TOKENS_GRANTED_SIGNAL)
    def tokens_granted(self, grant: TokenGrant) -> None:
        self._budget.on_grant(grant)

    @workflow.run
    async def run(self, inp: PooledInput) -> PooledOutput:
        pool = PooledTokens(self._budget, inp.region)

        async def one() -> None:
            await pool.take()
            self._served += 1

        await workflow.wait([asyncio.create_task(one()) for _ in range(inp.takes)])
        return PooledOutput(served=self._served, held=pool.held, requests=self._budget.counter)
