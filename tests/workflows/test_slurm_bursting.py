"""Slurm cloud bursting end to end, on a real slurmctld and Temporal's dev server.

1. A job of a valid contract (ci-runners: account ci, partition spot, tag ci) is
   allocated a powered-down CLOUD node; slurmctld runs deploy/slurm/sco-resume.
2. The program plans and starts an acquisition; the region worker acquires an instance
   named after the node from the simulated cloud.
3. The instance "boots": a slurmd for the node starts on loopback (what its cloud-init
   does; the one step one machine cannot do for real) and registers with slurmctld.
4. The job runs and completes.
5. After SuspendTime, slurmctld runs sco-suspend: SCO releases the instance.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from activities.events import InstanceState
from activities.exclusion.activities import ExclusionActivities, exclusion_activities
from activities.fleet.control_state import ControlRepository
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository
from activities.provider.interface import HOSTNAME_KEY, InstanceStatus
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from tests.support import histories, tools
from tests.support.control_harness import (
    install_example_bundle,
    poll_until,
    region_worker,
    scratch_fleet,
)
from tests.support.paths import REGIONS_DIR, REPO
from tests.support.services import namespace_prefix
from tests.support.slurm_burst_cluster import BurstCluster, burst_cluster
from tests.support.wait import WaitTimeout, eventually_async
from workers.settings import Settings
from workers.slurm_power_programs import release, resume
from workflows.acquisition.models import (
    AcquisitionInput,
    AcquisitionResult,
    LaunchItem,
    OperatorInput,
)
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.exclusion.models import exclusion_workflow_id
from workflows.exclusion.workflow import PoolExclusionWorkflow
from workflows.slurm.models import ReleaseReason

pytestmark = pytest.mark.timeout(240)
# The tests that start a Slurm; the resume-failed one calls the program's code directly.
needs_slurm = pytest.mark.tools(*tools.SLURMCTLD_SLURMD)

NODE = "r1-a-gp-l-001"
POOL = "r1.A.gp.l"


def program_env(
    client: Client, pg_dsn: str, cache: Path, trust: Path, tmp_path: Path
) -> dict[str, str]:
    """The SCO_* settings the power programs read from sco.env."""
    config = tmp_path / "sco.toml"  # settings come from sco.env alone
    config.write_text("")
    return {
        "SCO_PYTHON": sys.executable,
        "SCO_HOME": str(REPO),
        "SCO_CONFIG": str(config),
        "SCO_REGION": "r1",
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_POSTGRES_DSN": pg_dsn,
        "SCO_TEMPORAL__ADDRESS": client.service_client.config.target_host,
        "SCO_TEMPORAL__NAMESPACE_PREFIX": namespace_prefix(client),
        "SCO_CONTRACTS__CACHE_DIR": str(cache),
        "SCO_CONTRACTS__TRUST_DIR": str(trust),
        "SCO_SLURM__SLURMCTLD": "127.0.0.1",
        "SCO_SLURM__POLL_SECONDS": "0.2",
    }


def program_settings(
    client: Client, pg_dsn: str, cache: Path, trust: Path, **more: Any
) -> Settings:
    """The same settings as `program_env`, for calling the programs' functions in-process."""
    return Settings(
        region="r1",
        regions_dir=REGIONS_DIR,
        postgres_dsn=pg_dsn,
        temporal={"namespace_prefix": namespace_prefix(client)},
        contracts={"cache_dir": cache, "trust_dir": trust},
        **more,
    )


async def acquire_node(client: Client, node: str) -> AcquisitionResult:
    """What `sco-resume` starts for one node of ci-runners, run to the end on `sco-r1`."""
    return await client.execute_workflow(
        AcquisitionWorkflow.run,
        AcquisitionInput(
            region="r1",
            contract="ci-runners",
            tier=3,
            items=[
                LaunchItem(
                    pool_id=POOL,
                    hall="A",
                    flavor="gp.l",
                    instances=1,
                    units=2,
                    hostnames=[node],
                    user_data="#cloud-config\nhostname: {hostname}\n",
                )
            ],
            poll_seconds=0.1,
        ),
        id=f"slurm-r1-ci-runners-{uuid.uuid4().hex[:8]}",
        task_queue="sco-r1",
    )


async def cloud_init(cloud: SimulatedCloud, cluster: BurstCluster) -> None:
    """Instances with a hostname run slurmd for it while they are ACTIVE."""
    while True:
        up = {
            i.metadata[HOSTNAME_KEY]
            for i in await cloud.list_owned("r1")
            if i.status is InstanceStatus.ACTIVE and HOSTNAME_KEY in i.metadata
        }
        for node in up - set(cluster.slurmd):
            cluster.boot(node)
        for node in set(cluster.slurmd) - up:
            cluster.power_off(node)
        # sleep is the behaviour under test: the fake cloud-init's own look at the cloud
        await asyncio.sleep(0.2)


async def wait_for(what: str, check: object, within: float, cluster: BurstCluster) -> None:
    assert callable(check)
    try:
        await eventually_async(
            lambda: asyncio.to_thread(check), timeout=within, what=what, every=0.25, retrying=()
        )
    except WaitTimeout as exc:
        raise WaitTimeout(
            f"{exc}\npower log:\n{cluster.power_log()}\n"
            f"slurmctld log (tail):\n{cluster.log()[-3000:]}"
        ) from exc


@needs_slurm
async def test_job_bursts_onto_a_cloud_node_and_the_node_is_released(
    region_client: Client,
    region_r1: Region,
    pg_dsn: str,
    fleet_repo: FleetRepository,
    tmp_path: Path,
) -> None:
    cache, trust = install_example_bundle(tmp_path)
    loop = asyncio.get_running_loop()
    cloud = SimulatedCloud(region_r1, latency=Latency(boot_s=0.5), clock=loop.time)
    pool = open_pool(pg_dsn, max_size=4)
    control = ControlRepository(pool)
    sco_env = program_env(region_client, pg_dsn, cache, trust, tmp_path)
    try:
        ctx = burst_cluster({NODE: POOL}, sco_env, suspend_time=5)
        cluster = ctx.__enter__()
    except RuntimeError as exc:
        pytest.skip(f"slurmctld did not start here: {exc}")
    try:
        async with region_worker(
            region_client,
            cloud,
            fleet_repo,
            control,
            bundle_dir=cache,
            trust_dir=trust,
            queue="sco-r1",
        ):
            booter = asyncio.ensure_future(cloud_init(cloud, cluster))
            try:
                out = cluster.run(
                    "sbatch",
                    "-p",
                    "spot",
                    "-A",
                    "ci",
                    "--comment=sco-contract=ci",
                    "-o",
                    str(cluster.dir / "job.out"),
                    "--wrap",
                    "hostname; echo ran",
                )
                assert out.returncode == 0, out.stderr
                job_id = out.stdout.split()[-1]

                # 1-2: Slurm called our ResumeProgram, which started an acquisition.
                def acquired() -> bool:
                    return bool(fleet_repo.live_by_hostname("r1", [NODE]))

                await wait_for("an instance for the node", acquired, 60, cluster)
                [row] = fleet_repo.live_by_hostname("r1", [NODE])
                assert row.workload == "ci-runners" and row.pool_id == POOL
                assert row.acquisition_id and row.acquisition_id.startswith("slurm-r1-ci-runners-")
                assert '"verb": "resume"' in cluster.power_log()

                # 3-4: slurmd registered for the node and the job ran there.
                def job_done() -> bool:
                    state = cluster.run("scontrol", "show", "job", job_id, "-o").stdout
                    return "JobState=COMPLETED" in state

                await wait_for("the job to complete", job_done, 90, cluster)
                assert "ran" in (cluster.dir / "job.out").read_text()
                # Its cloud-init names the host after the node and starts slurmd for it.
                user_data = cloud.user_data[row.instance_id] or ""
                assert f"hostname: {NODE}" in user_data
                assert f'SLURMD_OPTIONS="-N {NODE} --conf-server 127.0.0.1"' in user_data
                assert fleet_repo.get_instance(row.instance_id).state is InstanceState.ACTIVE  # type: ignore[union-attr]

                # 5: idle for SuspendTime -> SuspendProgram -> the instance is released.
                def released() -> bool:
                    inst = fleet_repo.get_instance(row.instance_id)
                    return inst is not None and inst.state is InstanceState.DELETED

                await wait_for("the instance to be released", released, 90, cluster)
                assert row.acquisition_id is not None
                await histories.record(
                    region_client.get_workflow_handle(row.acquisition_id), "slurm_acquisition"
                )
                release_id = next(
                    wid
                    for line in cluster.power_log().splitlines()
                    if '"verb": "suspend"' in line
                    for wid in json.loads(line)["started"]
                )
                await histories.record(
                    region_client.get_workflow_handle(release_id), "slurm_release"
                )
                assert '"verb": "suspend"' in cluster.power_log()
                assert not [
                    i for i in await cloud.list_owned("r1") if i.metadata.get(HOSTNAME_KEY) == NODE
                ]
            finally:
                booter.cancel()
    finally:
        ctx.__exit__(None, None, None)
        pool.close()


@needs_slurm
async def test_a_job_without_a_contract_gets_its_node_set_down_with_the_reason(
    region_client: Client, pg_dsn: str, tmp_path: Path
) -> None:
    """SCO refuses what it cannot attribute, at once: the node goes DOWN naming why, so
    Slurm requeues the job instead of waiting out ResumeTimeout."""
    cache, trust = install_example_bundle(tmp_path)
    env = program_env(region_client, pg_dsn, cache, trust, tmp_path)
    try:
        ctx = burst_cluster({NODE: POOL}, env)
        cluster = ctx.__enter__()
    except RuntimeError as exc:
        pytest.skip(f"slurmctld did not start here: {exc}")
    try:
        out = cluster.run("sbatch", "-p", "spot", "-A", "ci", "--wrap", "true")
        assert out.returncode == 0, out.stderr

        def refused() -> bool:
            return "reason=sco" in cluster.run("scontrol", "show", "node", NODE).stdout.lower()

        await wait_for("the node to be set down", refused, 30, cluster)
        node = cluster.run("scontrol", "show", "node", NODE).stdout
        assert "job names no contract" in node
        assert "DOWN" in node
        assert '"refused": {"r1-a-gp-l-001"' in cluster.power_log()
    finally:
        ctx.__exit__(None, None, None)


@pytest.fixture
def own_fleet(region_r1: Region) -> Iterator[tuple[str, FleetRepository]]:
    """A fleet database of the test's own: the exclusion cycle's safety net counts every
    NOTICE of the pool in the last hour from fleet state, and the session's database
    holds other tests' notices for the same pool."""
    with scratch_fleet(region_r1, max_size=4) as (dsn, _, repo):
        yield dsn, repo


async def test_a_failed_resume_releases_the_instance_and_counts_against_the_pool(
    region_client: Client,
    region_r1: Region,
    own_fleet: tuple[str, FleetRepository],
    tmp_path: Path,
) -> None:
    """ResumeFailProgram: the instance is deleted and the pool's exclusion cycle counts
    the failure like a reclaim notice."""
    pg_dsn, fleet_repo = own_fleet
    cache, trust = install_example_bundle(tmp_path)
    cloud = SimulatedCloud(region_r1, latency=Latency(boot_s=0.0))
    pool = open_pool(pg_dsn, max_size=4)
    exclusion = ExclusionActivities(pool)
    node = "r1-a-gp-l-009"
    settings = program_settings(region_client, pg_dsn, cache, trust)
    try:
        async with region_worker(
            region_client,
            cloud,
            fleet_repo,
            ControlRepository(pool),
            bundle_dir=cache,
            trust_dir=trust,
            queue="sco-r1",
            extra_workflows=[PoolExclusionWorkflow],
            extra_activities=exclusion_activities(exclusion),
        ):
            result = await acquire_node(region_client, node)
            assert result.progress.active == 1
            [row] = fleet_repo.live_by_hostname("r1", [node])

            report = await release(
                settings, node, ReleaseReason.RESUME_FAILED, client=region_client
            )
            assert report.released == [row.instance_id] and report.ok

            async def gone() -> bool:
                inst = fleet_repo.get_instance(row.instance_id)
                return inst is not None and inst.state is InstanceState.DELETED

            await poll_until(gone, 90)
            handle = region_client.get_workflow_handle(exclusion_workflow_id(POOL))

            async def counted() -> bool:
                status = await handle.query(PoolExclusionWorkflow.status)
                return status.notices_in_window == 1

            await poll_until(counted, 90)
            await handle.terminate()
    finally:
        pool.close()


@needs_slurm
async def test_one_instance_per_node_across_resumes(
    region_client: Client,
    region_r1: Region,
    pg_dsn: str,
    fleet_repo: FleetRepository,
    tmp_path: Path,
) -> None:
    """An instance left from a node's earlier life is released before a new one is made;
    a node whose acquisition is still bringing it up is left to that acquisition."""
    cache, trust = install_example_bundle(tmp_path)
    loop = asyncio.get_running_loop()
    cloud = SimulatedCloud(region_r1, latency=Latency(boot_s=0.0), clock=loop.time)
    pool = open_pool(pg_dsn, max_size=4)
    node = "r1-a-gp-l-002"
    env = program_env(region_client, pg_dsn, cache, trust, tmp_path)
    try:
        ctx = burst_cluster({node: POOL}, env, programs=False)
        cluster = ctx.__enter__()
    except RuntimeError as exc:
        pool.close()
        pytest.skip(f"slurmctld did not start here: {exc}")
    settings = program_settings(
        region_client, pg_dsn, cache, trust, slurm={"slurm_conf": cluster.conf}
    )
    try:
        async with region_worker(
            region_client,
            cloud,
            fleet_repo,
            ControlRepository(pool),
            bundle_dir=cache,
            trust_dir=trust,
            queue="sco-r1",
        ):
            # The node's earlier life: an ACTIVE instance whose suspend never reached SCO.
            earlier = await acquire_node(region_client, node)
            [old_id] = earlier.instance_ids
            out = cluster.run(
                "sbatch", "-p", "spot", "-A", "ci", "--comment=sco-contract=ci", "--wrap", "true"
            )
            assert out.returncode == 0, out.stderr

            def configuring() -> bool:
                return "CONFIGURING" in cluster.run("squeue", "-h", "-o", "%T").stdout

            await wait_for("the job to be allocated the node", configuring, 30, cluster)
            # Slow boots from here on, so the new acquisition is still open below.
            cloud.latency = Latency(boot_s=30.0)
            report = await resume(settings, node, client=region_client)
            assert report.released == [old_id] and report.ok
            assert len(report.started) == 2  # the release, then the new acquisition

            async def replaced() -> bool:
                rows = fleet_repo.live_by_hostname("r1", [node])
                return [r.instance_id for r in rows] != [old_id] and len(rows) == 1

            await poll_until(replaced, 30)
            old = fleet_repo.get_instance(old_id)
            assert old is not None and old.state is InstanceState.DELETED

            # Slurm asks again while the new instance boots: nothing new is made.
            again = await resume(settings, node, client=region_client)
            assert again.in_flight == [node] and again.started == [] and again.released == []
            assert len(fleet_repo.live_by_hostname("r1", [node])) == 1
            [new] = fleet_repo.live_by_hostname("r1", [node])
            assert new.acquisition_id is not None
            await region_client.get_workflow_handle(new.acquisition_id).execute_update(
                "cancel", OperatorInput(operator="test", reason="done")
            )
    finally:
        ctx.__exit__(None, None, None)
        pool.close()
