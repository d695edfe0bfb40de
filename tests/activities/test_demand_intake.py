"""One intake for both schedulers: pending Slurm jobs (a real slurmctld, `squeue --json`)
and unschedulable Kubernetes pods (the official client against the recorded-response
server) become demand rows per source, and a contract's demand is their sum."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError
from typer.testing import CliRunner

from activities.control.models import partition_of
from activities.demand.intake import CollectInput, DemandIntakeActivities
from activities.demand.kubernetes import KubernetesPendingPods, api_client_from_kubeconfig
from activities.demand.model import normalise
from activities.demand.slurm import SlurmPendingJobs, SlurmRestPendingJobs
from activities.demand.source import DemandSource, SourceUnavailable
from activities.fleet.control_state import ControlRepository
from activities.fleet.db import open_pool
from activities.fleet.repository import FleetRepository
from activities.provider.simulator import SimulatedCloud
from contracts.bundle import installed_bundle
from contracts.region import Region
from tests.support import histories, tools
from tests.support.control_harness import Harness, install_example_bundle, poll_until, region_worker
from tests.support.k8s_recorded_server import recorded_k8s_server, write_kubeconfig
from tests.support.slurm_cluster import SlurmCluster, _stop, slurm_cluster
from tests.support.wait import WaitTimeout, eventually
from workers.cli.main import app
from workers.demand_sources import sources_for
from workers.settings import Settings
from workflows.controller.models import ControllerInput, controller_workflow_id
from workflows.controller.workflow import RegionControllerWorkflow
from workflows.intake.models import CollectNow, IntakeConfig, IntakeInput
from workflows.intake.workflow import DemandIntakeWorkflow

pytestmark = pytest.mark.timeout(120)

PERMISSIVE_LUA = """\
function slurm_job_submit(job_desc, part_list, submit_uid) return slurm.SUCCESS end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid) return slurm.SUCCESS end
"""


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    """Pending ci-runners work: the `spot` CLOUD nodes (2 x 2 CPUs) take two 2-CPU jobs
    (CONFIGURING: the ResumeProgram path), the rest waits (PENDING: this path)."""
    tools.require(*tools.SLURMCTLD)
    try:
        ctx = slurm_cluster(PERMISSIVE_LUA)
        cluster = ctx.__enter__()
    except RuntimeError as exc:
        pytest.skip(f"slurmctld did not start here: {exc}")
    try:
        ci = ["-p", "spot", "-A", "ci", "--comment=sco-contract=ci", "--mem=1000"]
        for _ in range(4):
            assert cluster.run("sbatch", *ci, "-c", "2", "--wrap", "true").returncode == 0
        # An array of three: three pending tasks of one unit each.
        array = ["-c", "2", "--array=1-3"]
        assert cluster.run("sbatch", *ci, *array, "--wrap", "true").returncode == 0
        # Two tasks of 2 vCPU on two nodes, 4 vCPU in all: two units.
        assert cluster.run("sbatch", *ci, "-n", "2", "-c", "2", "--wrap", "true").returncode == 0
        # Held: not demand until released. Wrong account: matches no contract.
        assert cluster.run("sbatch", *ci, "-c", "2", "--hold", "--wrap", "true").returncode == 0
        other = ["-p", "spot", "-A", "other", "--comment=sco-contract=ci"]
        assert cluster.run("sbatch", *other, "--wrap", "true").returncode == 0
        # Until the scheduler has placed the first two on the CLOUD nodes.
        try:
            eventually(
                lambda: (
                    cluster.run("squeue", "-h", "-t", "CF", "-o", "%i").stdout.split() == ["1", "2"]
                ),
                timeout=90,
                what="jobs 1 and 2 configuring on the CLOUD nodes",
                retrying=(),
            )
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}\n{cluster.run('squeue').stdout}") from exc
        yield cluster
    finally:
        ctx.__exit__(None, None, None)


@pytest.fixture(scope="module")
def slurmrestd(slurm: SlurmCluster) -> Iterator[str]:
    """slurmrestd for the cluster on a unix socket (rest_auth/local). Debian's Slurm has no
    auth/jwt, so no token path here; slurmrestd refuses root, so it runs as nobody."""
    tools.require("slurmrestd")  # runuser: util-linux, on every Debian
    rest_dir = slurm.dir / "rest"
    rest_dir.mkdir()
    rest_dir.chmod(0o777)  # nobody creates its socket here
    sock = rest_dir / "slurmrestd.sock"
    with (slurm.dir / "slurmrestd.out").open("wb") as out:
        proc = subprocess.Popen(
            [
                "runuser",
                "-u",
                "nobody",
                "--",
                "slurmrestd",
                "-a",
                "rest_auth/local",
                "-s",
                "openapi/v0.0.38",
                f"unix:{sock}",
            ],
            env=slurm.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"slurmrestd exited {proc.returncode}")
        return sock.exists()

    try:
        eventually(listening, timeout=30, what=f"slurmrestd's socket {sock}", retrying=())
    except (RuntimeError, WaitTimeout) as exc:
        _stop(proc)
        pytest.skip(
            f"slurmrestd did not start ({exc}): {(slurm.dir / 'slurmrestd.out').read_text()}"
        )
    yield f"unix:{sock}"
    _stop(proc)


def slurm_source(cluster: SlurmCluster) -> SlurmPendingJobs:
    return SlurmPendingJobs(env={"SLURM_CONF": str(cluster.conf)})


@contextlib.contextmanager
def kubernetes_source(tmp_path: Path) -> Iterator[KubernetesPendingPods]:
    with recorded_k8s_server("pending_pods") as server:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url)
        with api_client_from_kubeconfig(str(kubeconfig), "recorded") as api:
            yield KubernetesPendingPods(api)


@contextlib.asynccontextmanager
async def intake_worker(
    client: Client,
    cloud: SimulatedCloud,
    fleet: FleetRepository,
    control: ControlRepository,
    sources: list[DemandSource],
    cache: Path,
    trust: Path,
) -> AsyncIterator[Harness]:
    """The region worker with the intake workflow and its activity reading `sources`."""
    intake = DemandIntakeActivities(sources, control, lambda: installed_bundle(cache, trust))
    async with region_worker(
        client,
        cloud,
        fleet,
        control,
        bundle_dir=cache,
        trust_dir=trust,
        extra_workflows=[DemandIntakeWorkflow],
        extra_activities=[intake.collect],
    ) as h:
        yield h


@pytest.fixture
def control(pg_dsn: str) -> Iterator[ControlRepository]:
    pool = open_pool(pg_dsn, max_size=2)
    yield ControlRepository(pool)
    pool.close()


async def test_pending_jobs_are_read_from_squeue_json(slurm: SlurmCluster, tmp_path: Path) -> None:
    works = await slurm_source(slurm).pending()
    cache, trust = install_example_bundle(tmp_path)
    bundle, _ = installed_bundle(cache, trust)
    assert bundle is not None
    demand = normalise(bundle.content.contracts, "r1", works)
    # 2 waiting 2-CPU jobs + 3 array tasks + 2 units for the 4-CPU job; the held job does
    # not count, the CONFIGURING ones are the ResumeProgram's, `other` matches nothing.
    assert demand.units == {"ci-runners": 7}
    assert [u.reason for u in demand.unmatched] == [
        "no contract's slurm selector matches this work naming 'ci'"
    ]


async def test_slurmrestd_gives_the_same_pending_jobs_as_squeue(
    slurm: SlurmCluster, slurmrestd: str, tmp_path: Path
) -> None:
    cache, trust = install_example_bundle(tmp_path)
    bundle, _ = installed_bundle(cache, trust)
    assert bundle is not None
    rest = await SlurmRestPendingJobs(slurmrestd).pending()
    assert sorted(w.ref for w in rest) == sorted(w.ref for w in await slurm_source(slurm).pending())
    assert normalise(bundle.content.contracts, "r1", rest).units == {"ci-runners": 7}
    only_batch = SlurmRestPendingJobs(slurmrestd, partitions=["batch"])
    assert await only_batch.pending() == []
    with pytest.raises(SourceUnavailable, match="slurmrestd at unix:/nonexistent"):
        await SlurmRestPendingJobs("unix:/nonexistent/slurmrestd.sock").pending()
    with pytest.raises(SourceUnavailable, match="answered 404"):
        await SlurmRestPendingJobs(slurmrestd, api_version="v9.9.9").pending()
    with pytest.raises(SourceUnavailable, match="expected http"):
        await SlurmRestPendingJobs("ftp://x").pending()
    # The settings pick slurmrestd over squeue when slurm.rest_url is set.
    s = Settings(slurm={"pending_demand": True, "rest_url": slurmrestd})
    [source] = sources_for(s)
    assert isinstance(source, SlurmRestPendingJobs)


async def test_a_contracts_demand_is_the_sum_over_both_schedulers(
    slurm: SlurmCluster, control: ControlRepository, tmp_path: Path
) -> None:
    cache, trust = install_example_bundle(tmp_path)
    region = "r3"  # no other test keeps demand there; cleared below
    with kubernetes_source(tmp_path) as k8s:
        sources: list[DemandSource] = [slurm_source(slurm), k8s]
        intake = DemandIntakeActivities(sources, control, lambda: installed_bundle(cache, trust))
        result = await intake.collect(CollectInput(region=region))
    by_source = {r.source: r for r in result.reports}
    assert by_source["slurm"].ok and by_source["kubernetes"].ok
    slurm_units = by_source["slurm"].units.get("ci-runners", 0)
    k8s_units = by_source["kubernetes"].units.get("ci-runners", 0)
    assert slurm_units == 7 and k8s_units > 0
    rows = {(r.workload, r.source): r.units for r in control.list_demand(region)}
    assert rows[("ci-runners", "slurm")] == slurm_units
    assert rows[("ci-runners", "kubernetes")] == k8s_units
    assert control.demand_by_contract(region)["ci-runners"] == slurm_units + k8s_units
    assert "ci-runners" in result.changed

    # Slurm unreachable: its rows stay (no release of capacity work waits for), reported.
    broken = SlurmPendingJobs(squeue=str(tmp_path / "no-squeue"))
    intake = DemandIntakeActivities([broken], control, lambda: installed_bundle(cache, trust))
    again = await intake.collect(CollectInput(region=region))
    assert not again.reports[0].ok and "cannot run" in again.reports[0].error
    assert control.demand_by_contract(region)["ci-runners"] == slurm_units + k8s_units
    for source in ("slurm", "kubernetes"):
        control.replace_demand(region, source, {})


async def test_the_intake_workflow_stores_demand_and_wakes_the_controller(
    region_client: Client,
    region_r1: Region,
    slurm: SlurmCluster,
    control: ControlRepository,
    fleet_repo: FleetRepository,
    tmp_path: Path,
) -> None:
    cache, trust = install_example_bundle(tmp_path)
    cloud = SimulatedCloud(region_r1)
    partition = partition_of("ci-runners", 4)
    # The dev server, in a namespace of its own: the controller it wakes really plans and
    # starts acquisitions, which must not outlive the test in a shared server.
    async with intake_worker(
        region_client, cloud, fleet_repo, control, [slurm_source(slurm)], cache, trust
    ) as h:
        # The controller partition that owns ci-runners, parked on a long tick.
        controller = await h.client.start_workflow(
            RegionControllerWorkflow.run,
            ControllerInput(region="r1", partition=partition),
            id=controller_workflow_id("r1", partition),
            task_queue=h.queue,
        )
        control.replace_demand("r1", "slurm", {})
        handle = await h.client.start_workflow(
            DemandIntakeWorkflow.run,
            IntakeInput(region="r1", config=IntakeConfig(interval_seconds=3600)),
            id=f"demand-intake-test-{uuid.uuid4().hex[:6]}",
            task_queue=h.queue,
        )
        try:

            async def woke() -> bool:
                status = await handle.query(DemandIntakeWorkflow.status)
                return status.last is not None and bool(status.last.signalled)

            await poll_until(woke, 30)
            status = await handle.query(DemandIntakeWorkflow.status)
            assert status.last is not None
            assert status.last.signalled == [controller_workflow_id("r1", partition)]
            assert status.last.changed == ["ci-runners"]
            assert control.demand_by_contract("r1").get("ci-runners") == 7
            # collect_now: another round at once; nothing changed, nobody woken.
            await handle.signal(DemandIntakeWorkflow.collect_now, CollectNow())

            async def second() -> bool:
                return (await handle.query(DemandIntakeWorkflow.status)).rounds >= 2

            await poll_until(second, 30)
            status = await handle.query(DemandIntakeWorkflow.status)
            assert status.last is not None and status.last.changed == []
            await histories.record(handle, "demand_intake")
        finally:
            await handle.terminate()
            await controller.terminate()
            control.replace_demand("r1", "slurm", {})
            for acq in control.open_acquisitions("r1"):
                if acq.workload == "ci-runners":
                    with contextlib.suppress(RPCError):
                        await h.client.get_workflow_handle(acq.acquisition_id).terminate()


def test_sco_demand_sources_shows_what_each_scheduler_has_pending(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, trust = install_example_bundle(tmp_path)
    monkeypatch.setenv("SCO_CONTRACTS__CACHE_DIR", str(cache))
    monkeypatch.setenv("SCO_CONTRACTS__TRUST_DIR", str(trust))
    monkeypatch.setenv("SCO_SLURM__PENDING_DEMAND", "true")
    monkeypatch.setenv("SCO_SLURM__SLURM_CONF", str(slurm.conf))
    result = CliRunner().invoke(app, ["demand", "sources", "--region", "r1", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    [report] = out["reports"]
    assert report["source"] == "slurm" and report["units"] == {"ci-runners": 7}
    assert report["unmatched_count"] == 1

    monkeypatch.setenv("SCO_SLURM__PENDING_DEMAND", "false")
    result = CliRunner().invoke(app, ["demand", "sources"])
    assert result.exit_code == 1
    assert "no scheduler source is on" in result.output


async def test_a_source_unreadable_too_long_has_its_demand_dropped(
    region_client: Client,
    region_r1: Region,
    control: ControlRepository,
    fleet_repo: FleetRepository,
    tmp_path: Path,
) -> None:
    """Kept through an outage shorter than `stale_after_seconds`, dropped after it."""
    cache, trust = install_example_bundle(tmp_path)
    region = "r2"  # rows of its own in the shared database
    control.replace_demand(region, "slurm", {"ci-runners": 5})
    broken = SlurmPendingJobs(squeue=str(tmp_path / "no-squeue"))
    async with intake_worker(
        region_client, SimulatedCloud(region_r1), fleet_repo, control, [broken], cache, trust
    ) as h:
        handle = await h.client.start_workflow(
            DemandIntakeWorkflow.run,
            IntakeInput(
                region=region,
                config=IntakeConfig(interval_seconds=0.5, stale_after_seconds=2.0),
            ),
            id=f"demand-intake-test-{uuid.uuid4().hex[:6]}",
            task_queue=h.queue,
        )
        try:

            async def first_failure() -> bool:
                status = await handle.query(DemandIntakeWorkflow.status)
                return "slurm" in status.failing_since

            await poll_until(first_failure, 10)
            assert control.demand_by_contract(region) == {"ci-runners": 5}  # kept

            async def dropped() -> bool:
                # The rows go inside the activity, before the workflow has its report.
                status = await handle.query(DemandIntakeWorkflow.status)
                reported = status.last is not None and status.last.reports[0].dropped
                return reported and control.demand_by_contract(region) == {}

            await poll_until(dropped, 15)
            status = await handle.query(DemandIntakeWorkflow.status)
            assert status.last is not None
            [report] = status.last.reports
            assert not report.ok and report.dropped
        finally:
            await handle.terminate()
            control.replace_demand(region, "slurm", {})
