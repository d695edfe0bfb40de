"""FloorKeeperWorkflow on the time-skipping server against real PostgreSQL, the signed
example bundle and the in-process simulated cloud: a floor established, a hall lost
(declared and detected) and rebuilt in the survivors, the hall restored and the spread
rebalanced make-before-break, a changed floor from a new bundle; plus the pure planning."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg_pool import ConnectionPool
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from activities.events import EventKind, InstanceState
from activities.fleet.control_state import ControlRepository
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from activities.floor.activities import FloorActivities
from activities.floor.models import (
    FloorInstance,
    FloorShape,
    FloorSnapshot,
    HallCapacity,
    HallProbe,
    ProbeResult,
    floor_workflow_id,
)
from activities.provider.interface import InstanceStatus, Reservation
from activities.provider.simulator import Latency, SimulatedCloud
from contracts.region import Region
from planning.floor_spread import spread
from tests.support import histories, services
from tests.support.control_harness import (
    install_example_bundle,
    poll_until,
    region_worker,
    skip_time,
)
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO
from tests.support.signed_bundle import sign_and_install
from workflows.acquisition.workflow import AcquisitionWorkflow
from workflows.floor.models import FloorConfig, FloorInput, FloorState, HallEvent, HallLoss
from workflows.floor.plan import choose_shape, judge, plan_floor, to_release
from workflows.floor.workflow import WAKEUPS_FROM_TIMERS, FloorKeeperWorkflow

CONTRACT = "llm-train"  # floor r1: 10 units of 8 vCPU / 96 GiB / 1 GPU: gpu-a.l holds one
FLOOR = 10

# -- pure planning ---------------------------------------------------------------------------

_CAP = HallCapacity(free_vcpu=8192, free_memory_gib=32768, free_gpus=64, price_per_vcpu_hour=0.022)


def _shape(size: str, vcpu: int, upi: int) -> FloorShape:
    return FloorShape(
        sku="gpu-a",
        size=size,
        flavor=f"gpu-a.{size}",
        vcpu=vcpu,
        memory_gib=96 * upi,
        gpus=upi,
        units_per_instance=upi,
        pool_ids={h: f"r1.{h}.gpu-a.{size}" for h in "ABCD"},
    )


def _snap(units: int = FLOOR, halls: str = "ABCD") -> FloorSnapshot:
    return FloorSnapshot(
        region="r1",
        contract=CONTRACT,
        floor_units=units,
        halls=list(halls),
        shapes=[_shape("xl", 16, 2), _shape("l", 8, 1), _shape("4xl", 64, 8)],
        committed=dict.fromkeys(halls, _CAP),
    )


def test_spread_over_four_and_three_halls() -> None:
    assert spread(10, list("ABCD"), dict.fromkeys("ABCD", 99)).targets == {
        "A": 3,
        "B": 3,
        "C": 2,
        "D": 2,
    }
    three = spread(10, list("ACD"), dict.fromkeys("ACD", 99))
    assert three.targets == {"A": 4, "C": 3, "D": 3} and three.within_rules
    assert max(three.targets.values()) <= 0.4 * 10


def test_two_surviving_halls_are_degraded_with_a_reason() -> None:
    s = spread(10, ["A", "C"], {"A": 99, "C": 99})
    assert not s.within_rules and s.targets == {"A": 5, "C": 5}
    assert "2 healthy hall(s)" in s.reason
    plan = plan_floor(_snap(), lost={"B", "D"})
    assert plan.degraded and plan.launch == {"A": 5, "C": 5}
    short = spread(10, list("ABC"), {"A": 2, "B": 2, "C": 2})
    assert not short.within_rules and "4 instance(s) short" in short.reason


def test_shape_is_the_cheapest_per_unit_then_the_smallest() -> None:
    shape = choose_shape(_snap().shapes, _snap().committed)
    assert shape is not None and shape.flavor == "gpu-a.l"
    plan = plan_floor(_snap(units=15), lost=())
    assert plan.instances == 15 and plan.targets == {"A": 4, "B": 4, "C": 4, "D": 3}


def _held(i: int, hall: str, gen: int) -> FloorInstance:
    """An ACTIVE floor instance booted into the hall's reservation of generation `gen`."""
    return FloorInstance(
        instance_id=f"i{i}",
        hall=hall,
        pool_id=f"r1.{hall}.gpu-a.l",
        state=InstanceState.ACTIVE,
        acquisition_id=f"floor-r1-llm-train-{hall}-{gen}-abc",
    )


def test_release_waits_for_every_target_and_keeps_the_floor() -> None:
    held = [_held(i, h, 1) for i, h in enumerate("AAABBCCDD")] + [_held(20, "A", 2)]
    snap = _snap().model_copy(update={"instances": held})
    plan = plan_floor(snap, lost=())
    assert plan.launch == {"B": 1} and to_release(plan, held, ()) == []  # B not there yet
    held.append(_held(21, "B", 3))
    plan = plan_floor(snap.model_copy(update={"instances": held}), lost=())
    assert [i.instance_id for i in to_release(plan, held, ())] == ["i20"]  # newest first


def test_surplus_goes_from_the_newest_reservation_past_generation_nine() -> None:
    """Generation 12 is newer than 3: released first, so its reservation empties out and
    goes, instead of leaving two half-empty reservations in the hall (the testcloud floor
    test saw C holding 3 leased slots for 2 servers once retries pushed generations past 9)."""

    held = [_held(i, h, 1) for i, h in enumerate("AAABBBDD")]
    held += [_held(10, "C", 3), _held(11, "C", 3), _held(12, "C", 12)]
    plan = plan_floor(_snap().model_copy(update={"instances": held}), lost=())
    assert plan.surplus == {"C": 1}
    assert [i.instance_id for i in to_release(plan, held, ())] == ["i12"]
    # The old order (histories recorded before the patch replay with it) took generation 3.
    assert [i.instance_id for i in to_release(plan, held, (), by_generation=False)] == ["i11"]


def test_detection_needs_two_bad_probes_and_three_clean_ones() -> None:
    cfg = FloorConfig()
    bad = ProbeResult(halls={"B": HallProbe(instances=3, unhealthy=2), "A": HallProbe(instances=3)})
    v = judge(bad, {}, {}, {}, cfg)
    assert not v.lost and v.bad == {"A": 0, "B": 1}
    v = judge(bad, {}, v.bad, v.clean, cfg)
    assert list(v.lost) == ["B"]
    loss = HallLoss(hall="B", detected=True, by="sco", reason="", since=datetime.now(UTC))
    clean = ProbeResult(halls={"B": HallProbe(instances=0, answering=True)})
    bad_, clean_ = v.bad, v.clean
    for _ in range(2):
        v = judge(clean, {"B": loss}, bad_, clean_, cfg)
        assert not v.restored
        bad_, clean_ = v.bad, v.clean
    assert list(judge(clean, {"B": loss}, bad_, clean_, cfg).restored) == ["B"]
    operator = loss.model_copy(update={"detected": False})
    assert not judge(clean, {"B": operator}, {}, {"B": 5}, cfg).restored


# -- the workflow ----------------------------------------------------------------------------


@dataclass
class WatchingCloud(SimulatedCloud):
    """The simulated cloud, checking at every delete how many of the floor's instances
    remain ACTIVE: the only moment a floor can drop is when something is deleted."""

    watch: str = CONTRACT
    active_after_deletes: list[int] = field(default_factory=list)

    def floor_active(self, excluding: str | None = None) -> int:
        return sum(
            1
            for pid, inst in self._by_id.items()
            if pid != excluding
            and inst.info.metadata.get("sco-workload") == self.watch
            and self._status(inst) is InstanceStatus.ACTIVE
        )

    async def delete(self, provider_id: str) -> None:
        self.active_after_deletes.append(self.floor_active(excluding=provider_id))
        await super().delete(provider_id)

    def leases(self) -> list[Reservation]:
        return [lease.reservation for lease in self._leases.values()]


@dataclass
class Env:
    client: Client
    queue: str
    cloud: WatchingCloud
    fleet: FleetRepository
    pool: ConnectionPool
    bundle_base: Path


@pytest.fixture
def fresh_db(
    region_r1: Region,
) -> Iterator[tuple[FleetRepository, ControlRepository, ConnectionPool]]:
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    pool = open_pool(dsn, max_size=8)
    repo = FleetRepository(pool)
    repo.sync_pools(region_r1)
    yield repo, ControlRepository(pool), pool
    pool.close()
    services.drop_database(dsn)


@contextlib.asynccontextmanager
async def floor_worker(
    client: Client,
    cloud: SimulatedCloud,
    fleet: FleetRepository,
    control: ControlRepository,
    *,
    bundle_dir: Path,
    trust_dir: Path,
    queue: str | None = None,
    max_cached_workflows: int = 1000,
) -> AsyncIterator[str]:
    """tests/control_harness.py's region worker plus the floor keeper and its activities
    (on `queue`, default a fresh one)."""
    floor_acts = FloorActivities(
        fleet, cloud, regions_dir=REGIONS_DIR, bundle_cache_dir=bundle_dir, trust_dir=trust_dir
    )
    async with region_worker(
        client,
        cloud,
        fleet,
        control,
        bundle_dir=bundle_dir,
        trust_dir=trust_dir,
        queue=queue,
        max_cached_workflows=max_cached_workflows,
        extra_workflows=[FloorKeeperWorkflow],
        extra_activities=[floor_acts.snapshot, floor_acts.probe_halls],
    ) as h:
        yield h.queue


@pytest.fixture
async def env(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    fresh_db: tuple[FleetRepository, ControlRepository, ConnectionPool],
    tmp_path: Path,
) -> AsyncIterator[Env]:
    fleet, control, pool = fresh_db
    cache, trust = install_example_bundle(tmp_path)
    loop = asyncio.get_running_loop()
    cloud = WatchingCloud(region_r1, latency=Latency(boot_s=0.0), clock=loop.time)
    async with floor_worker(
        workflow_env.client, cloud, fleet, control, bundle_dir=cache, trust_dir=trust
    ) as queue:
        yield Env(workflow_env.client, queue, cloud, fleet, pool, tmp_path)


async def start_keeper(e: Env, **config: object) -> WorkflowHandle[FloorKeeperWorkflow, None]:
    return await e.client.start_workflow(
        FloorKeeperWorkflow.run,
        FloorInput(region="r1", contract=CONTRACT, config=FloorConfig.model_validate(config)),
        id=floor_workflow_id("r1", CONTRACT),
        task_queue=e.queue,
    )


def active_by_hall(e: Env) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in e.fleet.list_instances("r1", [InstanceState.ACTIVE]):
        if r.workload == CONTRACT and (r.acquisition_id or "").startswith("floor-"):
            out[r.hall] = out.get(r.hall, 0) + 1
    return dict(sorted(out.items()))


def floor_decisions(e: Env) -> list[tuple[str, str]]:
    with e.pool.connection() as conn:
        rows = conn.execute(
            "SELECT payload FROM outbox WHERE topic = 'sco.r1.decisions' ORDER BY created_at"
        ).fetchall()
    return [
        (r[0]["outcome"], r[0]["reason"])
        for r in rows
        if r[0]["kind"] == "floor" and r[0]["subject"].startswith(CONTRACT)
    ]


async def until_state(
    handle: WorkflowHandle[FloorKeeperWorkflow, None],
    state: FloorState,
    *,
    env: WorkflowEnvironment | None = None,
    held: dict[str, int] | None = None,
    within: float = 20,
) -> None:
    async def check() -> bool:
        if env is not None:
            await skip_time(env, 5)
        st = await handle.query(FloorKeeperWorkflow.status)
        return (
            st.state is state and not st.pending and (held is None or st.held_units_by_hall == held)
        )

    try:
        await poll_until(check, within=within)
    except AssertionError:
        raise AssertionError(await handle.query(FloorKeeperWorkflow.status)) from None


async def establish(e: Env, within: float = 20) -> WorkflowHandle[FloorKeeperWorkflow, None]:
    handle = await start_keeper(e)
    held = {"A": 3, "B": 3, "C": 2, "D": 2}
    await until_state(handle, FloorState.HOLDING, held=held, within=within)
    assert active_by_hall(e) == {"A": 3, "B": 3, "C": 2, "D": 2}
    assert {r.hall: r.amount for r in e.cloud.leases()} == {"A": 3, "B": 3, "C": 2, "D": 2}
    return handle


async def test_hall_lost_by_operator_is_rebuilt_in_the_survivors_then_rebalanced(
    env: Env, workflow_env: WorkflowEnvironment
) -> None:
    handle = await establish(env)
    env.cloud.fail_hall("B")
    await handle.signal(
        FloorKeeperWorkflow.hall_lost, HallEvent(hall="B", operator="ops", reason="power")
    )
    await until_state(handle, FloorState.HOLDING, held={"A": 4, "C": 3, "D": 3})
    st = await handle.query(FloorKeeperWorkflow.status)
    assert st.lost_halls == ["B"] and st.last_rebuild_seconds is not None
    assert active_by_hall(env) == {"A": 4, "C": 3, "D": 3}  # B's instances released
    assert {r.hall for r in env.cloud.leases()} == {"A", "C", "D"}
    outcomes = [o for o, _ in floor_decisions(env)]
    assert outcomes[:2] == ["hall_lost", "rebuilt"]

    # Recovery: make-before-break back to the spread.
    env.cloud.restore_hall("B")
    deletes_before = len(env.cloud.active_after_deletes)
    await handle.signal(
        FloorKeeperWorkflow.hall_restored, HallEvent(hall="B", operator="ops", reason="fixed")
    )
    await until_state(handle, FloorState.HOLDING, held={"A": 3, "B": 3, "C": 2, "D": 2})
    assert active_by_hall(env) == {"A": 3, "B": 3, "C": 2, "D": 2}
    during = env.cloud.active_after_deletes[deletes_before:]
    assert len(during) == 3 and min(during) >= FLOOR  # never below the floor
    assert sorted(r.amount for r in env.cloud.leases() if r.hall == "A") == [3]
    assert [o for o, _ in floor_decisions(env)][-2:] == ["hall_restored", "rebalanced"]
    await histories.record(handle, "floor_keeper")
    await handle.terminate()


async def test_hall_loss_is_detected_without_a_signal_and_two_halls_degrade(
    env: Env, workflow_env: WorkflowEnvironment
) -> None:
    handle = await establish(env)
    env.cloud.fail_hall("B")
    await until_state(handle, FloorState.HOLDING, env=workflow_env, held={"A": 4, "C": 3, "D": 3})
    st = await handle.query(FloorKeeperWorkflow.status)
    assert st.lost_halls == ["B"] and st.losses[0].detected and st.losses[0].by == "sco"

    # A second hall declared lost: two survivors cannot satisfy the rules. Loudly degraded.
    env.cloud.fail_hall("D")
    await handle.signal(FloorKeeperWorkflow.hall_lost, HallEvent(hall="D", operator="ops"))
    await until_state(handle, FloorState.DEGRADED, held={"A": 5, "C": 5})
    st = await handle.query(FloorKeeperWorkflow.status)
    assert "2 healthy hall(s)" in st.reason
    desc = await handle.describe()
    assert desc.search_attributes.get("SCOState") == ["degraded"]

    async def degraded_recorded() -> bool:  # the ledger's record follows the state
        return any(o == "degraded" and "2 healthy" in r for o, r in floor_decisions(env))

    await poll_until(degraded_recorded, within=60, what="the degraded decision recorded")

    # The provider answers cleanly for B again: lifted after three clean probes, and with
    # three healthy halls the floor is within the rules again.
    env.cloud.restore_hall("B")
    await until_state(handle, FloorState.HOLDING, env=workflow_env, held={"A": 4, "B": 3, "C": 3})
    st = await handle.query(FloorKeeperWorkflow.status)
    assert st.lost_halls == ["D"]  # D was an operator's word: only an operator lifts it
    await handle.terminate()


async def test_a_new_bundle_changes_the_floor(env: Env, workflow_env: WorkflowEnvironment) -> None:
    handle = await establish(env)
    src = env.bundle_base / "contracts"
    shutil.copytree(REPO / "contracts" / "examples", src)
    yaml = src / "llm-train.yaml"
    yaml.write_text(yaml.read_text().replace("floor: {r1: 10, r2: 5}", "floor: {r1: 15, r2: 5}"))
    assert sign_and_install(src, env.bundle_base) == 2
    await skip_time(workflow_env, 61)  # the next tick reads the new bundle
    await until_state(handle, FloorState.HOLDING, held={"A": 4, "B": 4, "C": 4, "D": 3})
    st = await handle.query(FloorKeeperWorkflow.status)
    assert st.floor_units == 15 and st.bundle_serial == 2
    await handle.terminate()


async def test_recorded_history_replays() -> None:
    replayer = Replayer(
        workflows=[FloorKeeperWorkflow, AcquisitionWorkflow],
        data_converter=pydantic_data_converter,
    )
    await replayer.replay_workflow(histories.load("floor_keeper"))


async def test_floor_instances_reclaimed_anyway_are_rebuilt_while_they_drain(
    env: Env, workflow_env: WorkflowEnvironment
) -> None:
    """`sco reclaim --force` on three of hall A's floor instances: while they drain they
    still fill hall A's reservation, so the keeper reserves anew instead of booting into
    a full one, and the floor is whole again before they are gone."""
    handle = await establish(env)
    rows = [
        r
        for r in env.fleet.list_instances("r1", [InstanceState.ACTIVE])
        if r.workload == CONTRACT and r.hall == "A"
    ]
    for r in rows:
        env.fleet.record_event(r.instance_id, EventKind.NOTICE, reason="operator reclaim")
    await skip_time(workflow_env, 61)  # the next tick
    await until_state(handle, FloorState.HOLDING, held={"A": 3, "B": 3, "C": 2, "D": 2})
    assert sorted(r.amount for r in env.cloud.leases() if r.hall == "A") == [3, 3]
    assert active_by_hall(env) == {"A": 3, "B": 3, "C": 2, "D": 2}
    await handle.terminate()


@pytest.mark.timeout(600)  # ~90 s alone: every task of every workflow is a full replay
async def test_a_worker_gone_between_a_timer_and_its_task_leaves_a_history_that_replays(
    workflow_env: WorkflowEnvironment,
    region_r1: Region,
    fresh_db: tuple[FleetRepository, ControlRepository, ConnectionPool],
    tmp_path: Path,
) -> None:
    """Issue 37's sequence: a holding keeper queried, its worker gone while its tick and
    probe timers fire (queries unanswered meanwhile), a new worker with no cache taking
    over while queries keep arriving during its tasks, and a hall lost. The history replays
    clean with this code, no workflow task failed, and the keeper woke from its timers."""
    fleet, control, pool = fresh_db
    cache, trust = install_example_bundle(tmp_path)
    loop = asyncio.get_running_loop()
    cloud = WatchingCloud(region_r1, latency=Latency(boot_s=0.0), clock=loop.time)
    client, queue = workflow_env.client, f"floor-{uuid.uuid4().hex[:8]}"
    # No cache: every task (and every query) replays the whole history, a restarted
    # worker's path, and the stopped worker leaves no sticky queue holding the next task.
    worker: dict[str, Any] = {
        "bundle_dir": cache,
        "trust_dir": trust,
        "queue": queue,
        "max_cached_workflows": 0,
    }
    async with floor_worker(client, cloud, fleet, control, **worker):
        e = Env(client, queue, cloud, fleet, pool, tmp_path)
        handle = await establish(e, within=120)  # every task a full replay: slower
    await skip_time(workflow_env, 61)  # the tick and probes fire with no worker
    with pytest.raises(RPCError):
        await handle.query(FloorKeeperWorkflow.status, rpc_timeout=timedelta(seconds=2))

    async def query_all_along() -> None:
        while True:
            with contextlib.suppress(RPCError):
                await handle.query(FloorKeeperWorkflow.status)
            # Each query is a full replay too: more often starves the worker when loaded.
            # sleep is the behaviour under test: queries arrive all along the replays
            await asyncio.sleep(0.25)

    async with floor_worker(client, cloud, fleet, control, **worker):
        querying = asyncio.ensure_future(query_all_along())
        try:
            cloud.fail_hall("B")
            await handle.signal(FloorKeeperWorkflow.hall_lost, HallEvent(hall="B", operator="ops"))
            survivors = {"A": 4, "C": 3, "D": 3}
            # ~30 s alone; every task and query a full replay, four test workers beside it
            await until_state(handle, FloorState.HOLDING, held=survivors, within=300)
        finally:
            querying.cancel()
    history = await handle.fetch_history()
    kinds = [ev.event_type for ev in history.events]
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in kinds
    assert any(  # the patch marker: this run took the timer loop
        WAKEUPS_FROM_TIMERS.encode() in ev.SerializeToString()
        for ev in history.events
        if ev.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    )
    await Replayer(
        workflows=[FloorKeeperWorkflow, AcquisitionWorkflow], data_converter=pydantic_data_converter
    ).replay_workflow(history)
    await handle.terminate()
