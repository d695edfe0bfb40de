"""Chaos cases on the real OpenStack test cloud: the region worker (`sco worker` with the
OpenStack provider, its own process) SIGKILLed again and again mid-acquisition and
mid-cancel. Duplicates and leaks are counted with openstacksdk directly (Nova's own view
of SCO's servers), ghosts in fleet state. Counts as JSON (tests/support/chaos.py), all 0.

Needs the test cloud (`make testcloud-up`); skips without it (fails with
SCO_REQUIRE_TESTCLOUD=1)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from contracts.region import Region
from tests.support import chaos, replay_all
from tests.support.testcloud import CLOUD, clouds_yaml, provider_or_skip, sco_servers
from tests.support.wait import WaitTimeout, eventually_async
from tests.support.worker_kills import (
    CloudView,
    KillableWorker,
    fleet_db,
    instance_counts,
    kill_repeatedly,
    region_namespace,
    results,
    worker_env,
)
from workflows.acquisition.models import (
    AcquisitionInput,
    AcquisitionResult,
    AcquisitionState,
    LaunchItem,
    OperatorInput,
)
from workflows.acquisition.workflow import AcquisitionWorkflow

pytestmark = [
    pytest.mark.testcloud,
    pytest.mark.chaos,
    pytest.mark.chaos_slow,  # minutes on a real cloud: `make chaos` only
    pytest.mark.timeout(900),
]

KILLS = 4


@pytest.fixture
def nova() -> Any:
    """openstacksdk's connection to the test cloud (not SCO's provider)."""
    return provider_or_skip().connection


@pytest.fixture
def tc_db(region_r1: Region) -> Iterator[str]:
    with fleet_db(region_r1) as dsn:
        yield dsn


async def nova_view(conn: Any) -> CloudView:
    servers = await asyncio.to_thread(sco_servers, conn)
    return CloudView([(s.name, s.id) for s in servers.values()])


@pytest.mark.parametrize("mode", ["mid_acquisition", "mid_cancel"])
async def test_killing_the_worker_on_the_test_cloud_never_duplicates_or_leaks(
    mode: str,
    nova: Any,
    dev_server_env: WorkflowEnvironment,
    tc_db: str,
    tmp_path: Path,
) -> None:
    client, ns_prefix = await region_namespace(dev_server_env, f"tck{mode[4:8]}")
    env = worker_env(
        client.service_client.config.target_host,
        ns_prefix,
        tc_db,
        tmp_path,
        SCO_PROVIDER__KIND="openstack",
        SCO_PROVIDER__OPENSTACK_CLOUD=CLOUD,
        SCO_PROVIDER__IMAGE="sco-image",
        OS_CLIENT_CONFIG_FILE=str(clouds_yaml()),
    )
    tag = f"acq-r1-tck-{uuid.uuid4().hex[:6]}"
    handles = []
    for i, (pool, hall) in enumerate([("r1.A.gp.l", "A"), ("r1.C.gp.l", "C")]):
        inp = AcquisitionInput(
            region="r1",
            contract=f"tck-{i}",
            tier=3,
            items=[LaunchItem(pool_id=pool, hall=hall, flavor="gp.l", instances=3, units=3)],
            max_parallel=3,
            poll_seconds=1.0,
        )
        handles.append(
            await client.start_workflow(
                AcquisitionWorkflow.run, inp, id=f"{tag}-{i}", task_queue="sco-r1"
            )
        )
    worker = KillableWorker(env, tmp_path / "worker.log")
    worker.start()
    try:
        if mode == "mid_cancel":

            async def some_created() -> bool:
                return any(n.startswith(tag) for n in (await nova_view(nova)).names)

            await eventually_async(
                some_created, timeout=300, what=f"some {tag} servers in nova", retrying=()
            )
            kills = asyncio.create_task(kill_repeatedly(worker, KILLS, low=2.0, high=6.0))
            for h in handles:
                await _cancel(h)
            await kills
            want = AcquisitionState.CANCELLED
        else:
            await kill_repeatedly(worker, KILLS, low=3.0, high=8.0)
            want = AcquisitionState.COMPLETED
        stuck = await results(
            handles,
            lambda r: isinstance(r, AcquisitionResult) and r.progress.state is want,
            within=600,
        )
        dead = int(not worker.alive())
    finally:
        worker.stop()

    # Nova deletes asynchronously: what a cancel deleted may still be listed a moment.
    async def settled() -> bool:
        counts = instance_counts(await nova_view(nova), tc_db, prefix=tag)
        return not any(counts.values())

    with contextlib.suppress(WaitTimeout):  # the counts below say what is left
        await eventually_async(
            settled, timeout=120, what=f"nova and the fleet clear of {tag}", retrying=()
        )
    view = await nova_view(nova)
    unreplayable = await replay_all.nondeterministic(client)
    counts = chaos.report(
        f"testcloud_worker_sigkill_{mode}",
        **instance_counts(view, tc_db, prefix=tag),
        servers_left_after_cancel=(
            sum(1 for n in view.names if n.startswith(tag)) if mode == "mid_cancel" else 0
        ),
        workflows_failed_or_stuck=stuck,
        # Every workflow of the namespace replays with this code (a wedged keeper or
        # acquisition stays Running and passes every other count).
        workflows_nondeterministic_on_replay=len(unreplayable),
        processes_dead_after_recovery=dead,
        worker_kills_short=KILLS - worker.kills,
    )
    assert chaos.nonzero(counts) == {}, (unreplayable, worker.log.read_text()[-5000:])


async def _cancel(handle: Any) -> None:

    async def accepted() -> bool:
        await asyncio.wait_for(
            handle.execute_update(AcquisitionWorkflow.cancel, OperatorInput(operator="chaos")),
            timeout=15,
        )
        return True

    # The worker is down just now, or its update times out: any error is asked again.
    await eventually_async(
        accepted, timeout=600, what=f"the cancel of {handle.id} accepted", every=1
    )
