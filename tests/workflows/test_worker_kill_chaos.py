"""Chaos cases: the region worker SIGKILLed again and again mid-cancel and mid-hall-loss
(mid-acquisition: tests/workflows/test_acquisition_crash.py), on Temporal's dev server and
the simulated cloud served over NATS from this process (it outlives every worker). Each
case prints its counts as JSON (tests/support/chaos.py), all zero: no duplicate instance,
none leaked at the cloud (counted in the simulator's own state), no ghost in fleet state,
no workflow failed or stuck, the worker alive after the last restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities.floor.models import floor_workflow_id
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from tests.support import chaos, replay_all
from tests.support.control_harness import install_example_bundle
from tests.support.wait import eventually_async
from tests.support.worker_kills import (
    KillableWorker,
    fleet_db,
    instance_counts,
    kill_repeatedly,
    region_namespace,
    results,
    served_cloud,
    sim_view,
    start_acquisitions,
    worker_env,
)
from workflows.acquisition.models import (
    AcquisitionResult,
    AcquisitionState,
    OperatorInput,
)
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.floor.models import FloorInput, FloorState, HallEvent
from workflows.floor.workflow import FloorKeeperWorkflow

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]


@pytest.fixture
def kill_db(region_r1: Region) -> Iterator[str]:
    with fleet_db(region_r1) as dsn:
        yield dsn


@pytest.fixture
async def sim(region_r1: Region) -> AsyncIterator[tuple[SimulatedCloud, str]]:
    # Boots take a while, so kills land while instances wait for ACTIVE and while
    # cancels delete them.
    async with served_cloud(region_r1, "kill", Latency(api_s=0.02, boot_s=1.5)) as served:
        yield served


async def cancel(handle: WorkflowHandle[AcquisitionWorkflow, AcquisitionResult]) -> None:
    """The operator's cancel, asked again while the worker is down (an update needs one)."""

    async def accepted() -> bool:
        await asyncio.wait_for(
            handle.execute_update(
                AcquisitionWorkflow.cancel, OperatorInput(operator="chaos", reason="test")
            ),
            timeout=10,
        )
        return True

    await eventually_async(
        accepted,
        timeout=300,
        what=f"the cancel of {handle.id} accepted",
        every=0.5,
        retrying=(RPCError, TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError),
    )


async def test_killing_the_worker_mid_cancel_leaves_nothing_behind(
    dev_server_env: WorkflowEnvironment,
    kill_db: str,
    sim: tuple[SimulatedCloud, str],
    tmp_path: Path,
) -> None:
    cloud, prefix = sim
    client, ns_prefix = await region_namespace(dev_server_env, "kcancel")
    address = client.service_client.config.target_host
    env = worker_env(
        address,
        ns_prefix,
        kill_db,
        tmp_path,
        SCO_PROVIDER__KIND="simulator",
        SCO_PROVIDER__SIMULATOR_PREFIX=prefix,
    )
    worker = KillableWorker(env, tmp_path / "worker.log")
    handles = await start_acquisitions(client, "kcancel", 4, 8)
    worker.start()
    try:
        # Cancel once some instances exist, then kill while the deletes are under way.
        await eventually_async(
            lambda: _some_created(cloud, "acq-r1-kcancel-"),
            timeout=240,
            what="some kcancel instances created",
            retrying=(),
        )
        kills = asyncio.create_task(kill_repeatedly(worker, 6, low=0.5, high=2.0))
        await asyncio.gather(*(cancel(h) for h in handles))
        await kills
        stuck = await results(
            handles,
            lambda r: (
                isinstance(r, AcquisitionResult) and r.progress.state is AcquisitionState.CANCELLED
            ),
            within=150,
        )
        dead = int(not worker.alive())
    finally:
        worker.stop()
    unreplayable = await replay_all.nondeterministic(client)
    counts = chaos.report(
        "worker_sigkill_mid_cancel",
        **instance_counts(await sim_view(cloud), kill_db, prefix="acq-r1-kcancel-"),
        # A cancelled acquisition leaves nothing at the cloud, whatever it had created.
        instances_left_after_cancel=sum(
            1 for n in (await sim_view(cloud)).names if n.startswith("acq-r1-kcancel-")
        ),
        workflows_failed_or_stuck=stuck,
        # Every workflow of the namespace (keepers, budget, acquisitions) replays with this
        # code: a wedged one stays Running and passes every other count.
        workflows_nondeterministic_on_replay=len(unreplayable),
        processes_dead_after_recovery=dead,
        worker_kills_short=6 - worker.kills,
    )
    assert chaos.nonzero(counts) == {}, (unreplayable, worker.log.read_text()[-5000:])


async def _some_created(cloud: SimulatedCloud, prefix: str) -> bool:
    return sum(1 for n in (await sim_view(cloud)).names if n.startswith(prefix)) >= 8


async def test_killing_the_worker_mid_hall_loss_keeps_the_floor_whole(
    dev_server_env: WorkflowEnvironment,
    kill_db: str,
    sim: tuple[SimulatedCloud, str],
    tmp_path: Path,
) -> None:
    cloud, prefix = sim
    client, ns_prefix = await region_namespace(dev_server_env, "khall")
    address = client.service_client.config.target_host
    cache, trust = install_example_bundle(tmp_path)
    env = worker_env(
        address,
        ns_prefix,
        kill_db,
        tmp_path,
        SCO_PROVIDER__KIND="simulator",
        SCO_PROVIDER__SIMULATOR_PREFIX=prefix,
        SCO_CONTRACTS__CACHE_DIR=str(cache),
        SCO_CONTRACTS__TRUST_DIR=str(trust),
    )
    worker = KillableWorker(env, tmp_path / "worker.log")
    contract = "llm-train"  # floor r1: 10 units, one per gpu-a.l instance
    worker.start()
    try:
        handle = await client.start_workflow(
            FloorKeeperWorkflow.run,
            FloorInput(region="r1", contract=contract),
            id=floor_workflow_id("r1", contract),
            task_queue="sco-r1",
        )
        await eventually_async(
            lambda: _holding(handle, {"A": 3, "B": 3, "C": 2, "D": 2}),
            timeout=120,
            what="the floor holding 3/3/2/2",
            retrying=(),
        )
        cloud.fail_hall("B")
        await handle.signal(
            FloorKeeperWorkflow.hall_lost, HallEvent(hall="B", operator="chaos", reason="power")
        )
        # Kills while B's share is reserved, booted and B's instances released elsewhere.
        await kill_repeatedly(worker, 6, low=0.5, high=2.0)
        stuck = 0
        try:
            await eventually_async(
                lambda: _holding(handle, {"A": 4, "C": 3, "D": 3}),
                timeout=150,
                what="the floor holding 4/3/3 without hall B",
                retrying=(),
            )
        except AssertionError:
            stuck = 1
        status = await handle.query(FloorKeeperWorkflow.status)
        dead = int(not worker.alive())
        await handle.terminate()
    finally:
        worker.stop()
    unreplayable = await replay_all.nondeterministic(client)
    counts = chaos.report(
        "worker_sigkill_mid_hall_loss",
        **instance_counts(await sim_view(cloud), kill_db, prefix=f"floor-r1-{contract}-"),
        floor_units_short=max(0, 10 - sum(status.held_units_by_hall.values())),
        workflows_failed_or_stuck=stuck,
        # Every workflow of the namespace (keepers, budget, acquisitions) replays with this
        # code: a wedged one stays Running and passes every other count.
        workflows_nondeterministic_on_replay=len(unreplayable),
        processes_dead_after_recovery=dead,
        worker_kills_short=6 - worker.kills,
    )
    assert chaos.nonzero(counts) == {}, (status, unreplayable, worker.log.read_text()[-5000:])


async def _holding(handle: WorkflowHandle[FloorKeeperWorkflow, None], held: dict[str, int]) -> bool:
    try:
        st = await handle.query(FloorKeeperWorkflow.status)
    except RPCError:  # no worker to answer the query just now
        return False
    return st.state is FloorState.HOLDING and not st.pending and st.held_units_by_hall == held
