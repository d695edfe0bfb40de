"""The region token budget's protocol, and the activity that makes sure a budget runs.

Messages live here, beside the one activity that does I/O for the budget, so that the
budget workflow (`workflows.budget.workflow`), the requester side
(`workflows.budget.client`) and operators' tools import them from one place, the way
workflow inputs enter workflow modules elsewhere in this code base (through
`workflow.unsafe.imports_passed_through()`). Nothing here imports workflow code: the
activity starts the budget by its type name.

Protocol (workflow to workflow, by signals):
    requester --request_tokens(TokenRequest)--> token-budget-<region>
    token-budget-<region> --tokens_granted(TokenGrant)--> requester
A grant may hold fewer tokens than asked (at least one); request ids are idempotency
keys per requester.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from planning.token_bucket import BucketState

BUDGET_WORKFLOW_TYPE = "TokenBudgetWorkflow"
REQUEST_TOKENS_SIGNAL = "request_tokens"
TOKENS_GRANTED_SIGNAL = "tokens_granted"
SET_RATE_SIGNAL = "set_rate"
STATUS_QUERY = "status"

DEFAULT_RATE_PER_SECOND = 10.0
DEFAULT_BURST = 20
DEFAULT_CONTINUE_AFTER_GRANTS = 2000


def budget_workflow_id(region: str) -> str:
    """The id of `region`'s one budget workflow."""
    return f"token-budget-{region}"


class TokenRequest(BaseModel):
    requester_workflow_id: str
    request_id: str
    """Unique per requester; a repeat of a known id is ignored."""
    tokens: int = Field(ge=1)


class TokenGrant(BaseModel):
    request_id: str
    tokens: int
    """Between 1 and the tokens asked for."""
    granted_at: datetime
    """The budget's workflow time when the tokens left the bucket."""


class SetRateInput(BaseModel):
    rate_per_second: float = Field(ge=0, allow_inf_nan=False)
    """0 pauses the budget: requests queue, nothing is granted."""
    burst: int = Field(ge=1)


class BudgetStatus(BaseModel):
    region: str
    rate_per_second: float
    burst: int
    tokens_available: float
    queued: int
    granted_total: int
    requests_total: int
    queued_tokens: int = 0


class BudgetInput(BaseModel):
    region: str
    rate_per_second: float = Field(ge=0, allow_inf_nan=False)
    burst: int = Field(ge=1)
    state: BucketState | None = None
    """Carried over by continue-as-new; when set, it wins over rate_per_second/burst."""
    queue: list[TokenRequest] = []
    seen: list[tuple[str, str]] = []
    """(requester_workflow_id, request_id) of recent grants, oldest first (bounded)."""
    continue_after_grants: int = Field(default=DEFAULT_CONTINUE_AFTER_GRANTS, ge=1)
    granted_total: int = 0
    requests_total: int = 0


class EnsureBudgetInput(BaseModel):
    region: str
    rate_per_second: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """The rate to start the budget with; None: the activity's default. A budget that
    runs already keeps its rate."""
    burst: int | None = Field(default=None, ge=1)


class BudgetActivities:
    """Starts regions' budget workflows on `task_queue` with a default rate and burst."""

    def __init__(
        self,
        client: Client,
        task_queue: str,
        *,
        rate_per_second: float = DEFAULT_RATE_PER_SECOND,
        burst: int = DEFAULT_BURST,
    ) -> None:
        self._client = client
        self._task_queue = task_queue
        self._rate_per_second = rate_per_second
        self._burst = burst

    @activity.defn(name="budget.ensure")
    async def ensure(self, inp: EnsureBudgetInput) -> None:
        """Start the region's budget unless it runs already (then leave it, rate and all).

        Idempotent: a retry, or many requesters ensuring at once, start one workflow."""
        handle = await self._client.start_workflow(
            BUDGET_WORKFLOW_TYPE,
            BudgetInput(
                region=inp.region,
                rate_per_second=(
                    self._rate_per_second if inp.rate_per_second is None else inp.rate_per_second
                ),
                burst=self._burst if inp.burst is None else inp.burst,
            ),
            id=budget_workflow_id(inp.region),
            task_queue=self._task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        activity.logger.info("budget for %s: %s run %s", inp.region, handle.id, handle.run_id)
