"""Temporal Worker Deployments on the real dev server: a rollout from build A to build B.

Two in-process workers serve one task queue as versions A and B of one deployment, with
the region's real workflows and activities (real PostgreSQL, the in-process simulated
cloud). Workers auto-upgrade by default (services/region_worker/service.py says why per-type
behaviours on `@workflow.defn` are not used); a single run is pinned by a start-time
override. A is current; a token budget (auto-upgrade) and an acquisition paused before its
first launch (pinned to A at start) start on A. B starts, is ramped, then set current:

- the budget's next workflow tasks run on B, with no workflow task failure (no
  non-determinism error) in its history;
- the acquisition, resumed after the switch, still finishes on A (its every workflow task
  completed by A) while B is current, and its token grants come from the budget on B.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from temporalio.api.enums.v1 import EventType, RoutingConfigUpdateState
from temporalio.api.enums.v1 import VersioningBehavior as ApiVersioningBehavior
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
    SetWorkerDeploymentRampingVersionRequest,
)
from temporalio.client import Client, WithStartWorkflowOperation, WorkflowHandle
from temporalio.common import (
    PinnedVersioningOverride,
    VersioningBehavior,
    WorkerDeploymentVersion,
    WorkflowIDConflictPolicy,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker, WorkerDeploymentConfig

from activities.budget import BudgetActivities, BudgetInput, SetRateInput, budget_workflow_id
from activities.control.activities import ControlActivities
from activities.fleet.activities import FleetActivities
from activities.fleet.control_state import ControlRepository
from activities.fleet.repository import FleetRepository
from activities.provider.activities import ProviderActivities, all_activities
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from services.region_worker.service import WORKFLOWS
from tests.support.control_harness import gp_acquisition, poll_until
from tests.support.paths import REGIONS_DIR
from tests.support.wait import eventually_async
from workers.settings import Settings
from workers.temporal_bootstrap import bootstrap_namespace
from workflows.acquisition.models import (
    AcquisitionResult,
    AcquisitionState,
    OperatorInput,
)
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.budget.workflow import TokenBudgetWorkflow

T = TypeVar("T")


def test_no_workflow_type_declares_a_behaviour_an_unversioned_worker_would_send() -> None:
    """A behaviour on `@workflow.defn` is sent with every workflow task completion, and the
    server rejects it from an unversioned worker: the box and the tests run unversioned."""
    for w in WORKFLOWS:
        defn = w.__temporal_workflow_definition  # type: ignore[attr-defined]
        assert defn.versioning_behavior in (None, VersioningBehavior.UNSPECIFIED), w


def test_versioning_settings_default_off_and_name_the_region(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.region_worker.service import deployment_config

    monkeypatch.delenv("SCO_WORKER__BUILD_ID", raising=False)
    s = Settings()
    assert s.worker.versioning is False and deployment_config(s, "r2") is None
    assert s.worker.deployment("r2") == "sco-r2"
    assert s.worker.effective_build_id()  # the package version
    monkeypatch.setenv("SCO_WORKER__VERSIONING", "true")
    monkeypatch.setenv("SCO_WORKER__BUILD_ID", "git-abc123")
    cfg = deployment_config(Settings(), "r2")
    assert cfg is not None and cfg.use_worker_versioning
    assert cfg.version == WorkerDeploymentVersion("sco-r2", "git-abc123")
    assert cfg.default_versioning_behavior is VersioningBehavior.AUTO_UPGRADE


# -- the rollout on the dev server ------------------------------------------------------


async def retry_until(
    call: Callable[[], Awaitable[T]], within: float = 30.0, what: str = "call"
) -> T:
    """Retry `call` while the server does not know the new version yet (it registers a
    version when its first poller arrives)."""

    async def answered() -> tuple[T]:
        return (await call(),)  # a tuple: truthy even when the call returns None

    (result,) = await eventually_async(
        answered, timeout=within, what=what, every=0.2, retrying=RPCError
    )
    return result


async def task_builds(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The build id of every completed workflow task, in order; fails on a failed task."""
    builds = []
    async for event in handle.fetch_history_events():
        assert event.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED, (
            f"{handle.id}: workflow task failed: {event.workflow_task_failed_event_attributes}"
        )
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            builds.append(
                event.workflow_task_completed_event_attributes.deployment_version.build_id
            )
    return builds


@pytest.fixture
async def namespace_client(dev_server_env: WorkflowEnvironment) -> AsyncIterator[Client]:
    ns = f"wv-{uuid.uuid4().hex[:8]}"
    await bootstrap_namespace(dev_server_env.client, ns, timedelta(days=1))
    client = await Client.connect(
        dev_server_env.client.service_client.config.target_host,
        namespace=ns,
        data_converter=pydantic_data_converter,
    )
    deployment = f"sco-wv-{uuid.uuid4().hex[:6]}"
    try:
        await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=ns, deployment_name=deployment)
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.UNIMPLEMENTED:
            pytest.skip(f"this Temporal server has no Worker Deployment API: {exc}")
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
    yield client


@contextlib.asynccontextmanager
async def versioned_worker(
    client: Client,
    queue: str,
    version: WorkerDeploymentVersion,
    activities: list[Any],
    executor: concurrent.futures.Executor,
) -> AsyncIterator[Worker]:
    worker = Worker(
        client,
        task_queue=queue,
        workflows=WORKFLOWS,
        activities=activities,
        activity_executor=executor,
        deployment_config=WorkerDeploymentConfig(
            version=version,
            use_worker_versioning=True,
            default_versioning_behavior=VersioningBehavior.AUTO_UPGRADE,
        ),
    )
    async with worker:
        yield worker


@pytest.mark.timeout(480)  # the routing's propagation alone may take minutes under load
async def test_rollout_auto_upgrades_entities_and_keeps_pinned_runs_on_their_build(
    namespace_client: Client,
    region_r1: Region,
    fleet_repo: FleetRepository,
    tmp_path: Path,
) -> None:
    client = namespace_client
    ns = client.namespace
    queue = f"sco-wv-{uuid.uuid4().hex[:6]}"
    deployment = f"sco-{queue}"
    build_a, build_b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    cloud = SimulatedCloud(
        region_r1, latency=Latency(boot_s=0.0), clock=asyncio.get_running_loop().time
    )
    control = ControlActivities(
        fleet_repo,
        ControlRepository(fleet_repo._pool),
        cloud,
        regions_dir=REGIONS_DIR,
        bundle_cache_dir=tmp_path / "cache",
        trust_dir=tmp_path / "trust",
    )
    fleet = FleetActivities(fleet_repo, REGIONS_DIR)
    budget = BudgetActivities(client, queue, rate_per_second=50.0, burst=50)
    activities = [
        fleet.record_acquire,
        fleet.record_event,
        *all_activities(ProviderActivities(cloud)),
        control.record_acquisition,
        control.record_decision,
        budget.ensure,
    ]

    async def set_current(build: str) -> None:
        await retry_until(
            lambda: client.workflow_service.set_worker_deployment_current_version(
                SetWorkerDeploymentCurrentVersionRequest(
                    namespace=ns, deployment_name=deployment, build_id=build, identity="test"
                )
            ),
            what=f"set {build} current",
        )

    with concurrent.futures.ThreadPoolExecutor(8) as executor:
        async with versioned_worker(
            client, queue, WorkerDeploymentVersion(deployment, build_a), activities, executor
        ):
            await set_current(build_a)
            budget_handle = await client.start_workflow(
                TokenBudgetWorkflow.run,
                BudgetInput(region="r1", rate_per_second=50.0, burst=50),
                id=budget_workflow_id("r1"),
                task_queue=queue,
            )
            name = f"wv-{uuid.uuid4().hex[:6]}"
            acq_id = f"acq-r1-{name}"

            # Paused in its first workflow task: it holds before any launch. Retried while
            # the server has not yet registered build A on the task queue's workflow side
            # ("Pinned version ... is not present in task queue": it registers a version
            # when its first poller of that type arrives); each attempt a new operation.
            def start_paused() -> Awaitable[Any]:
                return client.execute_update_with_start_workflow(
                    AcquisitionWorkflow.pause,
                    OperatorInput(operator="test", reason="hold across the rollout"),
                    start_workflow_operation=WithStartWorkflowOperation(
                        AcquisitionWorkflow.run,
                        gp_acquisition(name, 2),
                        id=acq_id,
                        task_queue=queue,
                        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                        versioning_override=PinnedVersioningOverride(
                            WorkerDeploymentVersion(deployment, build_a)
                        ),
                    ),
                )

            await retry_until(start_paused, what=f"{acq_id} started pinned to {build_a}")
            acq: WorkflowHandle[AcquisitionWorkflow, AcquisitionResult] = (
                client.get_workflow_handle_for(AcquisitionWorkflow.run, acq_id)
            )

            async def budget_started_on_a() -> bool:
                return build_a in await task_builds(budget_handle)

            await poll_until(budget_started_on_a)

            # Build B: new pods of the same deployment, ramped, then current.
            async with versioned_worker(
                client, queue, WorkerDeploymentVersion(deployment, build_b), activities, executor
            ):
                await retry_until(
                    lambda: client.workflow_service.set_worker_deployment_ramping_version(
                        SetWorkerDeploymentRampingVersionRequest(
                            namespace=ns,
                            deployment_name=deployment,
                            build_id=build_b,
                            percentage=25.0,
                            identity="test",
                        )
                    ),
                    what="ramp B",
                )
                await set_current(build_b)
                described = await client.workflow_service.describe_worker_deployment(
                    DescribeWorkerDeploymentRequest(namespace=ns, deployment_name=deployment)
                )
                routing = described.worker_deployment_info.routing_config
                assert routing.current_deployment_version.build_id == build_b

                # The server answers "current" before the new routing reaches every task
                # queue partition (routing_config_update_state IN_PROGRESS): a task
                # dispatched in that window still goes to A. Wait for the propagation, for
                # minutes under load (the dev server's deployment workflow retries on
                # ResourceExhausted), but not forever: the state can stay IN_PROGRESS after
                # the partitions have the routing (temporalio/temporal#11842, the completion
                # signal lost; CI saw 180 s pass). The budget moving to B is the proof.
                async def routing_state() -> RoutingConfigUpdateState.ValueType:
                    info = (
                        await client.workflow_service.describe_worker_deployment(
                            DescribeWorkerDeploymentRequest(
                                namespace=ns, deployment_name=deployment
                            )
                        )
                    ).worker_deployment_info
                    return info.routing_config_update_state

                async def routing_propagated() -> bool:
                    return await routing_state() in (
                        RoutingConfigUpdateState.ROUTING_CONFIG_UPDATE_STATE_UNSPECIFIED,
                        RoutingConfigUpdateState.ROUTING_CONFIG_UPDATE_STATE_COMPLETED,
                    )

                with contextlib.suppress(AssertionError):  # WaitTimeout: see above
                    await poll_until(routing_propagated, within=120, what="routing propagated")

                # The auto-upgrade entity moves to B at its next workflow task. A signal
                # gives it one; another signal while its last task still ran on A (a
                # partition that had not yet seen the routing) gives it the next.
                async def budget_on_b() -> bool:
                    if (await task_builds(budget_handle))[-1:] == [build_b]:
                        return True
                    await budget_handle.signal(
                        TokenBudgetWorkflow.set_rate, SetRateInput(rate_per_second=40.0, burst=40)
                    )
                    return False

                try:
                    await eventually_async(budget_on_b, timeout=150, what="budget on B", every=1.0)
                except AssertionError as exc:
                    state = RoutingConfigUpdateState.Name(await routing_state())
                    raise AssertionError(f"{exc}; the routing's update state: {state}") from exc

                # The pinned acquisition resumes and finishes on A, B being current.
                await acq.execute_update(
                    AcquisitionWorkflow.resume, OperatorInput(operator="test", reason="go")
                )
                result = await asyncio.wait_for(acq.result(), timeout=60)
                assert result.progress.state is AcquisitionState.COMPLETED
                assert result.progress.active == 2

                acq_builds = await task_builds(acq)
                assert acq_builds and set(acq_builds) == {build_a}
                info = (await acq.describe()).raw_description.workflow_execution_info
                # The worker's behaviour is auto-upgrade; the start-time override pins it.
                override = info.versioning_info.versioning_override
                assert override.behavior == ApiVersioningBehavior.VERSIONING_BEHAVIOR_PINNED
                assert info.versioning_info.deployment_version.build_id == build_a

                # The budget granted the acquisition's tokens on B, and never failed a task.
                budget_builds = await task_builds(budget_handle)
                first_b = budget_builds.index(build_b)
                assert set(budget_builds[:first_b]) == {build_a}
                assert set(budget_builds[first_b:]) == {build_b}
                status = await budget_handle.query(TokenBudgetWorkflow.status)
                assert status.granted_total >= 2
                info = (await budget_handle.describe()).raw_description.workflow_execution_info
                assert info.versioning_info.behavior == (
                    ApiVersioningBehavior.VERSIONING_BEHAVIOR_AUTO_UPGRADE
                )
                assert info.versioning_info.deployment_version.build_id == build_b
                await budget_handle.terminate(reason="test done")
