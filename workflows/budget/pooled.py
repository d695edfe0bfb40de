"""PooledTokens: a workflow's concurrent takes of one budget, asked for together.

An acquisition launches up to `max_parallel` slots at once and each needs one token per
create. Asked for one by one, that is a burst of request signals into the region's budget
workflow and as many grant signals back into the acquisition; Temporal serialises every
update of a workflow under one lock, and a burst of signals into one workflow stalls its
tasks in steps of ~0.5 s (bench/control_bench.py's trials showed the first create of a
15-instance acquisition 1-3 s after the demand change, most of it there). Pooled, the
takes that wait together send one request for as many tokens as there are takes waiting,
and one grant comes back: the budget still grants between 1 and that many (never more
than its bucket holds), the first waiters are served, and the rest ask again, together.

Deterministic workflow code (the BudgetClient underneath does the signalling). A token
granted but no longer wanted (its take was cancelled) stays in the pool for the next take;
what is left when the workflow ends was spent, as a take's timeout spends it (conservative).
"""

from __future__ import annotations

import asyncio

from temporalio import workflow

from workflows.budget.client import BudgetClient


class PooledTokens:
    """One requester's takes of one region's budget, pooled; one per requester run."""

    def __init__(self, client: BudgetClient, region: str) -> None:
        self._client = client
        self._region = region
        self._waiting = 0  # takes not yet served
        self._tokens = 0  # granted, not yet handed to a take
        self._asking = False  # one request at the budget at a time

    @property
    def held(self) -> int:
        """Tokens granted and not yet handed to a take."""
        return self._tokens

    async def take(self) -> None:
        """Wait for one token. The take that finds no request in flight asks for one token
        per take then waiting; the others wait for that grant (or, when it falls short of
        them, ask again together)."""
        self._waiting += 1
        try:
            while self._tokens == 0:
                if self._asking:
                    await workflow.wait_condition(lambda: self._tokens > 0 or not self._asking)
                    continue
                self._asking = True
                try:
                    # One turn of the workflow's event loop first: the takes made ready
                    # by this same activation (slots whose state writes came back
                    # together) join this request instead of making the next one.
                    await asyncio.sleep(0)
                    self._tokens += await self._client.take(self._region, self._waiting)
                finally:
                    self._asking = False
            self._tokens -= 1
        finally:
            self._waiting -= 1
