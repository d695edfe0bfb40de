"""What the lifecycle workflow's tests share, on the simulator (tests/workflows/
test_lifecycle_workflow.py) and on the real test cloud (test_lifecycle_testcloud.py):
spark-etl's bundle with a `disruption` block, the halls' notice relays answering drain
requests over real NATS (and every notice heard), the lifecycle activities, and reading
what the workflow decided from the ledger's outbox."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import nats
import yaml
from nacl.signing import SigningKey
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from psycopg_pool import ConnectionPool
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.events import InstanceState
from activities.fleet.control_state import ControlRepository
from activities.fleet.repository import FleetRepository
from activities.floor.activities import FloorActivities
from activities.lifecycle.activities import LifecycleActivities
from activities.lifecycle.models import lifecycle_workflow_id
from activities.provider.interface import CloudProvider
from contracts.notice import ReclaimNotice, reclaim_subject
from services.notice_relay.relay import NoticeRelay
from services.notice_relay.service import request_handler
from tests.support.control_harness import poll_until, skip_time
from tests.support.paths import REGIONS_DIR, REPO
from tests.support.signed_bundle import sign_and_install
from tests.support.wait import eventually_async
from tests.support.worker_nats import NATS_URL
from workflows.floor.workflow import FloorKeeperWorkflow
from workflows.lifecycle.models import LifecycleConfig, LifecycleInput, LifecycleState, PauseInput
from workflows.lifecycle.workflow import LifecycleWorkflow

CONTRACT = "spark-etl"  # tier 2: gp/mem, xl/2xl, halls A-D, 4 vCPU / 16 GiB a unit
LEAD = timedelta(seconds=120)  # r1's notice lead
BUDGET_OF_ONE: dict[str, Any] = {"budgets": [{"max_instances": 1}]}
#: Halls whose notice relay runs in these tests: hall D has none (a drain there is not told).
RELAY_HALLS = ("A", "B", "C")


@dataclass
class Life:
    """A lifecycle test's worker queue, fleet state and bundle folder, and what the halls'
    notice relays were asked."""

    client: Client
    queue: str
    fleet: FleetRepository
    pool: ConnectionPool
    base: Path
    notices: list[ReclaimNotice]
    # At each notice: spark-etl's instances then noticed or draining (the one told included).
    leaving_at_notice: list[int]


def install_bundle(
    base: Path,
    disruption: dict[str, Any],
    *,
    also: tuple[str, ...] = (),
    floors: dict[str, int] | None = None,
    **placement: Any,
) -> None:
    """The example contracts, spark-etl with `disruption` and `placement` overrides (and
    the contracts in `also` with the same `disruption`, those in `floors` with that r1
    floor), compiled, signed and installed (a new serial each time; one key for all).
    spark-etl leaves its spread group (batch) unless `placement` names one: at these
    tests' few units its cap per pool (1 unit) is under one instance, and they test the
    workflow's steps, not the spread (tests/planning/test_lifecycle_spread.py does)."""
    src = base / "contracts"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(REPO / "contracts" / "examples", src)
    path = src / f"{CONTRACT}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["disruption"] = disruption
    doc["placement"].update({"spread_groups": [], **placement})
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    for other in also:
        path = src / f"{other}.yaml"
        doc = yaml.safe_load(path.read_text())
        doc["disruption"] = disruption
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    for contract, units in (floors or {}).items():
        path = src / f"{contract}.yaml"
        doc = yaml.safe_load(path.read_text())
        doc["floor"]["r1"] = units
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    sign_and_install(src, base)


async def _no_backlog() -> int:
    return 0  # the test runs no region worker to tell the exclusion cycle


async def relay_answering(
    nc: NatsClient, fleet: FleetRepository, provider: CloudProvider, hall: str
) -> None:
    """Hall `hall`'s notice relay answering reclaim requests, as `sco notice-relay` does."""
    relay = NoticeRelay(
        region="r1",
        hall=hall,
        lead=LEAD,
        repo=fleet,
        provider=provider,
        js=nc.jetstream(),
        signing_key=SigningKey.generate(),
    )
    await relay.ensure_stream()
    await nc.subscribe(reclaim_subject("r1", hall), cb=request_handler(relay, _no_backlog))


async def relays_heard(
    nc: NatsClient, fleet: FleetRepository, provider: CloudProvider
) -> tuple[list[ReclaimNotice], list[int]]:
    """The relays of RELAY_HALLS answering on `nc`, and (filled as they come) the notices
    they publish with, at each, how many of spark-etl's instances were then leaving."""
    notices: list[ReclaimNotice] = []
    leaving: list[int] = []

    async def heard(msg: Msg) -> None:
        notices.append(ReclaimNotice.from_json(json.loads(msg.data)["notice"]))
        rows = fleet.list_instances("r1", [InstanceState.NOTICED, InstanceState.DRAINING])
        leaving.append(sum(1 for r in rows if r.workload == CONTRACT))

    for hall in RELAY_HALLS:
        await relay_answering(nc, fleet, provider, hall)
    await nc.subscribe("sco.r1.notice.>", cb=heard)
    return notices, leaving


def lifecycle_worker_kwargs(
    fleet: FleetRepository, pool: ConnectionPool, provider: CloudProvider, base: Path
) -> dict[str, Any]:
    """What a harness worker (`region_worker`, `provider_worker`) needs beside its own
    arguments to run the lifecycle and the floor keeper on `provider`: the bundle under
    `base`, drains told over NATS."""
    cache, trust = base / "cache", base / "trust"
    life = LifecycleActivities(
        fleet,
        ControlRepository(pool),
        provider,
        regions_dir=REGIONS_DIR,
        bundle_cache_dir=cache,
        trust_dir=trust,
        nats_connect=lambda: nats.connect(NATS_URL),
    )
    floor = FloorActivities(
        fleet, provider, regions_dir=REGIONS_DIR, bundle_cache_dir=cache, trust_dir=trust
    )
    return {
        "bundle_dir": cache,
        "trust_dir": trust,
        "extra_workflows": [LifecycleWorkflow, FloorKeeperWorkflow],
        "extra_activities": [
            life.snapshot,
            life.instance,
            life.unused_fallback_leases,
            life.tell_drain,
            floor.snapshot,
            floor.probe_halls,
        ],
    }


async def start(e: Life, **config: Any) -> WorkflowHandle[LifecycleWorkflow, None]:
    cfg = LifecycleConfig.model_validate({"interval_seconds": 60, "min_age_seconds": 0, **config})
    return await e.client.start_workflow(
        LifecycleWorkflow.run,
        LifecycleInput(region="r1", config=cfg),
        id=lifecycle_workflow_id("r1"),
        task_queue=e.queue,
    )


def decisions(e: Life, kind: str) -> list[tuple[str, str, str]]:
    """(subject, outcome, reason) of `kind` decisions, in order."""
    with e.pool.connection() as conn:
        rows = conn.execute(
            "SELECT payload FROM outbox WHERE topic = 'sco.r1.decisions' ORDER BY id"
        ).fetchall()
    return [
        (r[0]["subject"], r[0]["outcome"], r[0]["reason"]) for r in rows if r[0]["kind"] == kind
    ]


def live(e: Life) -> list[tuple[str, str, str, str]]:
    """(instance, pool, capacity type, acquisition) of spark-etl's ACTIVE instances."""
    return sorted(
        (r.instance_id, r.pool_id, r.capacity_type.value, r.acquisition_id or "")
        for r in e.fleet.list_instances("r1", [InstanceState.ACTIVE])
        if r.workload == CONTRACT
    )


async def until_replaced(
    e: Life,
    workflow_env: WorkflowEnvironment,
    n: int,
    within: float = 120,
    *,
    skip: float = 30,
    every: float = 0.05,
) -> None:
    """Until `n` `replaced` decisions, skipping `skip` s of workflow time at each look
    (every `every` s at most): a real cloud's boots take real time, and skipping much
    faster than they go would outrun a replacement's build timeout."""

    def replaced(seen: list[tuple[str, str, str]]) -> bool:
        return sum(1 for _, o, _ in seen if o == "replaced") >= n

    await _until_decided(e, workflow_env, replaced, f"{n} replacement(s)", within, skip, every)


async def until_held(
    e: Life,
    workflow_env: WorkflowEnvironment,
    subject: str,
    why: str,
    within: float = 60,
    *,
    skip: float = 30,
    every: float = 0.05,
) -> None:
    """Until a `held` decision about `subject` whose reason contains `why`."""

    def held(seen: list[tuple[str, str, str]]) -> bool:
        return any(s == subject and o == "held" and why in r for s, o, r in seen)

    await _until_decided(e, workflow_env, held, f"{subject} held: {why}", within, skip, every)


async def _until_decided(
    e: Life,
    workflow_env: WorkflowEnvironment,
    done: Callable[[list[tuple[str, str, str]]], bool],
    what: str,
    within: float,
    skip: float,
    every: float,
) -> None:
    """Until `done(disruption decisions)`, skipping `skip` s of workflow time at each look;
    on timeout the failure shows the decisions seen and the workflow time it gave up at."""

    async def check() -> bool:
        await skip_time(workflow_env, skip)
        return done(decisions(e, "disruption"))

    try:
        await eventually_async(check, timeout=within, what=what, every=every)
    except AssertionError as exc:
        at = await workflow_env.get_current_time()
        raise AssertionError(
            f"{exc}; workflow time {at}; disruption decisions: {decisions(e, 'disruption')}"
        ) from None


async def pause_settled(handle: WorkflowHandle[LifecycleWorkflow, None]) -> None:
    """Pause the workflow and wait until any round under way has finished."""
    await handle.signal(LifecycleWorkflow.pause, PauseInput(operator="test"))

    async def paused() -> bool:
        st = await handle.query(LifecycleWorkflow.status)
        return st.state is LifecycleState.PAUSED and not st.pending and not st.in_flight

    await poll_until(paused, within=30)


def assert_one_at_a_time(e: Life) -> None:
    """Budget of 1: every `replacing` comes after the previous replacement's `replaced`."""
    started = 0
    for _, outcome, _ in decisions(e, "disruption"):
        if outcome == "replacing":
            started += 1
            assert started == 1, decisions(e, "disruption")
        elif outcome == "replaced":
            started -= 1
