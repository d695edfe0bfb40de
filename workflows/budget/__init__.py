"""The region token budget: one durable token bucket per region, shared by every workflow
that makes mutating OpenStack calls there.

- the pure bucket arithmetic is `planning.token_bucket` (activities read it too);
- `workflow`: TokenBudgetWorkflow, the per-region entity workflow;
- `client`: BudgetClient, the requester side, used inside other workflows.

Messages, signal names and the ensure activity are in `activities.budget`. This module
imports nothing: the workflow sandbox re-runs it whenever it loads the budget workflow.
"""
