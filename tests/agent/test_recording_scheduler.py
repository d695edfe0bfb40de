"""The recording scheduler fake keeps the `NodeScheduler` contract."""

from __future__ import annotations

from agent.scheduler import SchedulerError, Workload
from tests.support.agent_fakes import RecordingScheduler


async def test_the_recording_scheduler_records_and_queues_an_error() -> None:
    fake = RecordingScheduler([Workload(id="1", socket_name="slurm_1")])
    await fake.cordon("n1", "why")
    fake.next_error = SchedulerError("gone", not_found=True)
    try:
        await fake.requeue(fake.workloads_on_node[0], 5)
    except SchedulerError as exc:
        assert exc.not_found
    assert fake.ops() == [("cordon", "n1"), ("requeue", "1")]
