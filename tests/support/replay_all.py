"""Replay every workflow of a namespace with this code: the end of each worker-kill chaos
case (issue 37). A keeper wedged by a nondeterminism error stays Running and passes every
"still running" check; a replay of its history with the code that runs it does not."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from services.region_worker.service import WORKFLOWS


async def nondeterministic(client: Client) -> list[str]:
    """`<workflow id>: <error>` for each workflow (any status, every run) whose history does
    not replay with the region worker's workflows."""
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)
    bad = []
    async with replayer.workflow_replay_iterator(
        client.list_workflows("").map_histories()
    ) as results:
        async for result in results:
            if result.replay_failure is not None:
                bad.append(f"{result.history.workflow_id}: {result.replay_failure}")
    return bad
