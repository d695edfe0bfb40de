"""Chaos case: Temporal's server SIGKILLed in the middle of acquisitions and started again
on the same address and database file (the dev server with `--db-filename`, as `sco dev
up` runs it, so its state survives). The region worker (`sco worker`, its own process) is
never restarted: it must ride out the outage by itself. Counts as JSON
(tests/support/chaos.py), all zero."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from tests.support import chaos, services
from tests.support.wait import eventually_async
from tests.support.worker_kills import (
    KillableWorker,
    fleet_db,
    instance_counts,
    results,
    served_cloud,
    sim_view,
    start_acquisitions,
    worker_env,
)
from workers.devbox.services import TemporalService
from workers.settings import Settings
from workflows.acquisition.models import (
    AcquisitionResult,
    AcquisitionState,
)
from workflows.acquisition.workflow import AcquisitionWorkflow

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

ACQUISITIONS = 4
EACH = 8


@pytest.fixture
def restart_db(region_r1: Region) -> Iterator[str]:
    with fleet_db(region_r1) as dsn:
        yield dsn


class OwnTemporal(chaos.KillableService):
    """Temporal's dev server of the test's own: a free port, a database file."""

    def __init__(self, tmp_path: Path) -> None:
        self.prefix = f"trs{uuid.uuid4().hex[:6]}-"
        self.settings = Settings(
            data_dir=tmp_path / "temporal-data",
            regions=["r1"],
            temporal={
                "address": f"127.0.0.1:{services.free_port()}",
                "ui_port": services.free_port(),
                "namespace_prefix": self.prefix,
            },
        )
        svc = TemporalService(self.settings)
        super().__init__(svc)
        svc.prepare()

    @property
    def address(self) -> str:
        return self.settings.temporal.address


@pytest.fixture
def own_temporal(tmp_path: Path) -> Iterator[OwnTemporal]:
    server = OwnTemporal(tmp_path)
    yield server
    server.stop()


@pytest.fixture
async def sim(region_r1: Region) -> AsyncIterator[tuple[SimulatedCloud, str]]:
    async with served_cloud(region_r1, "trs", Latency(api_s=0.02, boot_s=2.0)) as served:
        yield served


async def _created(cloud: SimulatedCloud) -> bool:
    return any(i.name.startswith("acq-r1-trs-") for i in await cloud.list_owned("r1"))


async def test_acquisitions_complete_across_a_temporal_server_restart(
    own_temporal: OwnTemporal,
    restart_db: str,
    sim: tuple[SimulatedCloud, str],
    tmp_path: Path,
) -> None:
    cloud, prefix = sim
    client = await Client.connect(
        own_temporal.address,
        namespace=f"{own_temporal.prefix}r1",
        data_converter=pydantic_data_converter,
    )
    env = worker_env(
        own_temporal.address,
        own_temporal.prefix,
        restart_db,
        tmp_path,
        SCO_PROVIDER__KIND="simulator",
        SCO_PROVIDER__SIMULATOR_PREFIX=prefix,
    )
    worker = KillableWorker(env, tmp_path / "worker.log")
    worker.start()
    ids = []
    try:
        ids += [h.id for h in await start_acquisitions(client, "trs", ACQUISITIONS, EACH)]
        # Kill once instances are being created and booted.
        await eventually_async(
            lambda: _created(cloud),
            timeout=120,
            what="some trs instances created",
            retrying=(),
        )
        own_temporal.kill()
        # sleep is the behaviour under test: Temporal stays down; polls and completions fail
        await asyncio.sleep(5)
        await asyncio.to_thread(own_temporal.start)  # its probe runs asyncio.run
        # A fresh client: the old one's connection went with the server.
        client = await Client.connect(
            own_temporal.address,
            namespace=f"{own_temporal.prefix}r1",
            data_converter=pydantic_data_converter,
        )
        stuck = await results(
            [client.get_workflow_handle_for(AcquisitionWorkflow.run, i) for i in ids],
            lambda r: (
                isinstance(r, AcquisitionResult)
                and r.progress.state is AcquisitionState.COMPLETED
                and r.progress.active == EACH
            ),
            within=180,
        )
        dead = int(not worker.alive())
    finally:
        worker.stop()
    view = await sim_view(cloud)
    counts = chaos.report(
        "temporal_server_restart",
        **instance_counts(view, restart_db, prefix="acq-r1-trs-"),
        instances_short=max(
            0, ACQUISITIONS * EACH - sum(1 for n in view.names if n.startswith("acq-r1-trs-"))
        ),
        workflows_failed_or_stuck=stuck,
        processes_dead_after_recovery=dead,
    )
    assert chaos.nonzero(counts) == {}, worker.log.read_text()[-5000:]
