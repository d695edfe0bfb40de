"""Tracing: a demand change is one trace, from the signal `sco demand set` sends through
the controller's tick to the creates of the acquisition it starts (workflows/tracing.py),
on the time-skipping server with real PostgreSQL and the in-process simulated cloud."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities.control.models import ACQUISITION_PREFIX, partition_of
from activities.events import InstanceState
from activities.fleet.control_state import ControlRepository
from activities.fleet.repository import FleetRepository
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from tests.support.control_harness import (
    Harness,
    fleet_repositories,
    install_example_bundle,
    poll_until,
    region_worker,
)
from workflows.controller.models import ControllerConfig, ControllerInput, DemandChanged
from workflows.controller.workflow import RegionControllerWorkflow
from workflows.tracing import SignalTracingInterceptor

pytestmark = pytest.mark.timeout(180)

CONTRACT = "spark-etl"


@pytest.fixture
def fresh_fleet(region_r1: Region) -> Iterator[tuple[FleetRepository, ControlRepository]]:
    with fleet_repositories(region_r1) as repos:
        yield repos


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
async def traced(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    fresh_fleet: tuple[FleetRepository, ControlRepository],
    spans: tuple[TracerProvider, InMemorySpanExporter],
    tmp_path: Path,
) -> AsyncIterator[Harness]:
    """The region worker on a client traced as the processes trace (workers/tracing.py)."""
    interceptor = SignalTracingInterceptor(spans[0].get_tracer("sco-test"))
    config = workflow_env.client.config()
    config["interceptors"] = [interceptor]
    client = Client(**config)
    cache, trust = install_example_bundle(tmp_path)
    cloud = SimulatedCloud(
        region_r1, latency=Latency(boot_s=0.0), clock=asyncio.get_running_loop().time
    )
    async with region_worker(client, cloud, *fresh_fleet, bundle_dir=cache, trust_dir=trust) as h:
        yield h


def active_units(h: Harness) -> int:
    rows = h.fleet.list_instances("r1", [InstanceState.ACTIVE])
    return sum(2 if r.size == "xl" else 4 for r in rows if r.workload == CONTRACT)


async def test_a_demand_change_is_one_trace_from_the_signal_to_the_creates(
    traced: Harness, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    h, (provider, exporter) = traced, spans
    wid = f"controller-trace-{uuid.uuid4().hex[:6]}"
    handle = await h.client.start_workflow(
        RegionControllerWorkflow.run,
        ControllerInput(
            region="r1", partition=partition_of(CONTRACT, 4), config=ControllerConfig()
        ),
        id=wid,
        task_queue=h.queue,
    )

    async def ticked() -> bool:
        st = await handle.query(RegionControllerWorkflow.status)
        return st.ticks >= 1

    await poll_until(ticked, within=60)  # the first tick: no demand, nothing to start

    # What `sco demand set` does: the demand row, then the signal.
    h.control.set_demand("r1", "cli", {CONTRACT: 8})
    await handle.signal(
        RegionControllerWorkflow.demand_changed, DemandChanged(contracts=[CONTRACT], source="cli")
    )

    async def covered() -> bool:
        return active_units(h) >= 8

    await poll_until(covered, within=120)
    await handle.terminate()
    provider.force_flush()
    finished: tuple[ReadableSpan, ...] = exporter.get_finished_spans()

    def named(name: str) -> list[ReadableSpan]:
        return [s for s in finished if s.name == name]

    def trace_of(s: ReadableSpan) -> int:
        assert s.context is not None
        trace_id: int = s.context.trace_id
        return trace_id

    (signal,) = named("SignalWorkflow:demand_changed")
    trace = trace_of(signal)
    in_trace = [s for s in finished if trace_of(s) == trace]
    names = {s.name for s in in_trace}
    # The signal's handling, the tick it woke, the tick's activities and the acquisition.
    assert {
        "HandleSignal:demand_changed",
        "ControllerTick",
        "StartActivity:control.snapshot",
        "RunActivity:control.snapshot",
        "StartChildWorkflow:AcquisitionWorkflow",
        "RunWorkflow:AcquisitionWorkflow",
        "StartActivity:provider.create_instance",
        "RunActivity:provider.create_instance",
    } <= names, sorted(names)
    # A chain, not siblings: the handling is the signal's child, the tick the handling's.
    (handled,) = [s for s in in_trace if s.name == "HandleSignal:demand_changed"]
    (tick,) = [s for s in in_trace if s.name == "ControllerTick"]
    assert handled.parent is not None and handled.parent.span_id == signal.context.span_id
    assert tick.parent is not None and tick.parent.span_id == handled.context.span_id
    # One trace: every create of every acquisition the change started is in it.
    creates = named("RunActivity:provider.create_instance")
    assert creates and {trace_of(s) for s in creates} == {trace}
    acquisitions = {
        str((s.attributes or {}).get("temporalWorkflowID"))
        for s in named("RunWorkflow:AcquisitionWorkflow")
    }
    assert acquisitions and all(a.startswith(ACQUISITION_PREFIX) for a in acquisitions)
    # The controller's start is a trace of its own: its first tick is not in this one.
    (started,) = named("StartWorkflow:RegionControllerWorkflow")
    assert trace_of(started) != trace
