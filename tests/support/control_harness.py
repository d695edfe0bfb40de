"""A region worker for tests: every control-plane workflow and activity on a uuid task
queue, against real PostgreSQL and an in-process simulated cloud."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from psycopg_pool import ConnectionPool
from temporalio.api.testservice.v1 import SleepRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.budget import BudgetActivities, budget_workflow_id
from activities.control.activities import ControlActivities
from activities.fleet.activities import FleetActivities
from activities.fleet.control_state import ControlRepository
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from activities.provider.activities import ProviderActivities, all_activities
from activities.provider.interface import CloudProvider
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from planning.arbiter import FallbackItem, FallbackPlan
from tests.support import services
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO
from tests.support.signed_bundle import sign_and_install
from tests.support.wait import eventually_async
from workflows.acquisition.models import AcquisitionInput, AcquisitionResult, LaunchItem
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.budget.workflow import TokenBudgetWorkflow
from workflows.controller.models import ControllerConfig
from workflows.controller.workflow import RegionControllerWorkflow
from workflows.slurm.workflow import SlurmReleaseWorkflow


@contextmanager
def scratch_fleet(
    region: Region, max_size: int = 8
) -> Iterator[tuple[str, ConnectionPool, FleetRepository]]:
    """A scratch fleet database of its own (migrated, `region`'s pools): its DSN, a pool of
    `max_size` on it and a repository; dropped afterwards."""
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    pool = open_pool(dsn, max_size=max_size)
    repo = FleetRepository(pool)
    repo.sync_pools(region)
    yield dsn, pool, repo
    pool.close()
    services.drop_database(dsn)


@contextmanager
def fleet_repositories(region: Region) -> Iterator[tuple[FleetRepository, ControlRepository]]:
    """Fleet and control state in a scratch database of their own, dropped afterwards."""
    with scratch_fleet(region) as (_, pool, repo):
        yield repo, ControlRepository(pool)


@dataclass
class Harness:
    client: Client
    queue: str
    cloud: SimulatedCloud
    fleet: FleetRepository
    control: ControlRepository

    async def start_acquisition(
        self, name: str, *, instances: int, max_parallel: int
    ) -> WorkflowHandle[AcquisitionWorkflow, AcquisitionResult]:
        """`gp_acquisition(name, instances)` polling every 0.1 s, on this worker, as
        workflow `acquisition_id(name)`."""
        inp = gp_acquisition(name, instances, max_parallel=max_parallel, poll_seconds=0.1)
        return await self.client.start_workflow(
            AcquisitionWorkflow.run, inp, id=acquisition_id(name), task_queue=self.queue
        )


def gp_acquisition(name: str, instances: int, **options: Any) -> AcquisitionInput:
    """Contract `name`'s acquisition of `instances` gp.l instances in r1's hall A, tier 2;
    `options`: more of its fields."""
    item = LaunchItem(
        pool_id="r1.A.gp.l", hall="A", flavor="gp.l", instances=instances, units=instances
    )
    return AcquisitionInput(region="r1", contract=name, tier=2, items=[item], **options)


def acquisition_id(name: str) -> str:
    """The workflow id of contract `name`'s acquisition in r1 (`Harness.start_acquisition`)."""
    return f"acq-r1-{name}"


def install_example_bundle(
    base: Path, overrides: dict[str, dict[str, Any]] | None = None
) -> tuple[Path, Path]:
    """Compile and sign the example contracts; return (bundle cache dir, trust dir).
    `overrides`: per example contract name, top-level fields to set in it first."""
    src = REPO / "contracts" / "examples"
    if overrides:
        import shutil

        import yaml

        shutil.copytree(src, base / "contracts")
        src = base / "contracts"
        for name, fields in overrides.items():
            path = src / f"{name}.yaml"
            path.write_text(yaml.safe_dump(yaml.safe_load(path.read_text()) | fields))
    sign_and_install(src, base)
    return base / "cache", base / "trust"


@asynccontextmanager
async def provider_worker(
    client: Client,
    provider: CloudProvider,
    fleet: FleetRepository,
    control: ControlRepository,
    *,
    bundle_dir: Path,
    trust_dir: Path,
    rate_per_second: float = 50.0,
    burst: int = 50,
    queue: str | None = None,
    extra_workflows: Sequence[type] = (),
    extra_activities: Sequence[Callable[..., Any]] = (),
    fleet_activities: FleetActivities | None = None,
    regions_dir: Path = REGIONS_DIR,
    max_cached_workflows: int = 1000,
) -> AsyncIterator[str]:
    """Every control-plane workflow and activity on one queue (yielded), on any provider:
    the simulator here, the real test cloud in `tests/support/testcloud.py`.
    `fleet_activities`: fleet-state writes of the test's own (one that fails, say);
    `regions_dir`: where the region files are (a bench's own region);
    `max_cached_workflows`: 0 for a worker that replays the whole history for every task
    (a just-restarted worker's path; no sticky queue for a stopped worker to hold)."""
    queue = queue or f"tq-{uuid.uuid4()}"
    fleet_acts = fleet_activities or FleetActivities(fleet, regions_dir)
    cloud_acts = ProviderActivities(provider)
    control_acts = ControlActivities(
        fleet,
        control,
        provider,
        regions_dir=regions_dir,
        bundle_cache_dir=bundle_dir,
        trust_dir=trust_dir,
    )
    budget = BudgetActivities(client, queue, rate_per_second=rate_per_second, burst=burst)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        async with Worker(
            client,
            task_queue=queue,
            workflows=[
                AcquisitionWorkflow,
                RegionControllerWorkflow,
                TokenBudgetWorkflow,
                SlurmReleaseWorkflow,
                *extra_workflows,
            ],
            activities=[
                fleet_acts.record_acquire,
                fleet_acts.record_event,
                *all_activities(cloud_acts),
                control_acts.snapshot,
                control_acts.greedy_plan,
                control_acts.exact_plan,
                control_acts.record_acquisition,
                control_acts.record_decision,
                control_acts.mark_surplus,
                budget.ensure,
                *extra_activities,
            ],
            activity_executor=pool,
            max_cached_workflows=max_cached_workflows,
        ):
            try:
                yield queue
            finally:
                # The budget is one workflow per region id; the next test starts its own.
                with contextlib.suppress(RPCError):
                    await client.get_workflow_handle(budget_workflow_id("r1")).terminate()


def fallback_above_authority(contract: str) -> FallbackPlan:
    """Committed fallback above the contract's spend authority: it waits for an operator."""
    item = FallbackItem(
        pool_id="r1.A.cpu.xl", hall="A", flavor="cpu.xl", instances=1, units=2, price_per_hour=1.0
    )
    return FallbackPlan(
        contract=contract,
        shortfall_units=2,
        items=[item],
        cost_per_hour=1.0,
        current_spend_per_hour=0.0,
        authority_per_hour=0.1,
        needs_approval=True,
        reason="above authority (test)",
    )


@asynccontextmanager
async def region_worker(
    client: Client,
    cloud: SimulatedCloud,
    fleet: FleetRepository,
    control: ControlRepository,
    *,
    bundle_dir: Path,
    trust_dir: Path,
    rate_per_second: float = 50.0,
    burst: int = 50,
    queue: str | None = None,
    extra_workflows: Sequence[type] = (),
    extra_activities: Sequence[Callable[..., Any]] = (),
    fleet_activities: FleetActivities | None = None,
    regions_dir: Path = REGIONS_DIR,
    max_cached_workflows: int = 1000,
) -> AsyncIterator[Harness]:
    """`queue`: default a fresh uuid queue; `extra_*`: more workflows and activities on it;
    `fleet_activities`: in place of the real fleet-state writes; `regions_dir`: where the
    region files are (a bench's own region)."""
    async with provider_worker(
        client,
        cloud,
        fleet,
        control,
        bundle_dir=bundle_dir,
        trust_dir=trust_dir,
        rate_per_second=rate_per_second,
        burst=burst,
        queue=queue,
        extra_workflows=extra_workflows,
        extra_activities=extra_activities,
        fleet_activities=fleet_activities,
        regions_dir=regions_dir,
        max_cached_workflows=max_cached_workflows,
    ) as q:
        yield Harness(client, q, cloud, fleet, control)


@asynccontextmanager
async def instant_boot_worker(
    client: Client, region: Region, fleet: FleetRepository, tmp_path: Path, **options: Any
) -> AsyncIterator[Harness]:
    """`region_worker` on a simulated cloud whose instances boot at once, fleet and control
    state in `fleet`'s database, the bundle cache and trust store under `tmp_path`;
    `options`: region_worker's."""
    cloud = SimulatedCloud(
        region, latency=Latency(boot_s=0.0), clock=asyncio.get_running_loop().time
    )
    async with region_worker(
        client,
        cloud,
        fleet,
        ControlRepository(fleet._pool),
        bundle_dir=tmp_path / "cache",
        trust_dir=tmp_path / "trust",
        **options,
    ) as h:
        yield h


async def poll_until(
    check: Callable[[], Awaitable[bool]], within: float = 30.0, what: str = "the condition"
) -> None:
    """`eventually_async` on `check` (every 50 ms at most); WaitTimeout (an AssertionError)
    after `within` seconds."""
    await eventually_async(check, timeout=within, what=what, every=0.05)


async def skip_past_next_tick(
    env: WorkflowEnvironment,
    controller: WorkflowHandle[Any, Any],
    tick_seconds: float = ControllerConfig().tick_seconds,
) -> None:
    """Skip time to just after the controller's next tick, so a signal sent next meets a
    tick timer ~a whole tick away. A signal whose workflow task cancels that timer while it
    falls due in real time makes the test server reject the CancelTimer ("invalid history
    builder state for action") on every retry of the task (tests/workflows/
    test_pool_exclusion.py); on a loaded machine a random phase lands there."""
    st = await controller.query(RegionControllerWorkflow.status)
    assert st.last is not None, "the controller has not ticked yet"
    since = (await env.get_current_time() - st.last.at).total_seconds()
    await skip_time(env, max(0.0, tick_seconds - since) + 1.0)

    async def ticked() -> bool:
        now = await controller.query(RegionControllerWorkflow.status)
        return now.ticks > st.ticks

    await poll_until(ticked, within=60, what="the controller's next tick")


async def skip_time(env: WorkflowEnvironment, seconds: float) -> None:
    """`env.sleep` with a generous RPC timeout. The test server answers once the skipped
    span is over, and activities inside it take real time; on a loaded machine (CI with the
    test cloud up) that outlasts the client's default RPC timeout ("Timeout expired")."""
    req = SleepRequest()
    req.duration.FromTimedelta(timedelta(seconds=seconds))
    await env.client.test_service.unlock_time_skipping_with_sleep(
        req, timeout=timedelta(seconds=300)
    )
