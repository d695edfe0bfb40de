"""Early-warning benchmark: planned reclaims end to end on Temporal's real dev server, real
NATS JetStream, real PostgreSQL and the simulated cloud (in-process).

    .venv/bin/python bench/early_warning_bench.py [--trials 10] [--warning-min 10]
        [--compression 12] [--tiny]

Per trial one ACTIVE instance of a DCP training contract (llm-train, opted in with
`drain.early_warning: checkpoint`) runs a node agent (real Agent, NATS notice source,
signed bundle) and a DCP-shaped training job on the real checkpoint protocol. The reclaim
is planned through the hall's notice relay (`ReclaimRequest(at=...)`, what `sco reclaim
--at` sends): the relay writes the plan to fleet state, signs and publishes the early
warning, and the region worker's notice hooks (workers/notice_hooks.py, reading the notice
stream) wake the region controller (RegionControllerWorkflow on the dev server), which
counts the doomed instance as leaving and starts a replacement. The relay loop sends the
hard notice at reclaim time - lead and deletes the node at the deadline, as
`sco notice-relay` does.

replaced_before_hard_notice: fraction of trials whose contract is covered again by ACTIVE
    instances other than the doomed one before the hard notice went out. Target >= 90 %.
lost_steps_max: training steps the job loses per reclaim (its last step minus the step of
    its last checkpoint, the one a requeued job resumes from). Target <= 1.

Time is compressed by --compression K, every modelled duration alike: the warning, the
region's notice lead (120 s), the controller tick (60 s), the cloud's API latency (2 s per
call) and boot time (180 s, create to ACTIVE) are all divided by K. What is not scaled is
the real machinery (Temporal round trips, activities, PostgreSQL, NATS): each real second
of it counts as K modelled seconds, so the compressed run is pessimistic, never kinder.
The job trains a step every 0.5 modelled seconds. The job is DCP-shaped, not torch: its
checkpoint writes the state at the current step under the training lock, as the DCP
adapter does (tests/agent/test_agent_early_warning.py runs the real torch DCP job).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nats
from nacl.encoding import HexEncoder
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.control.models import partition_of
from activities.events import InstanceState
from activities.fleet.control_state import ControlRepository
from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository, InstanceRow
from activities.provider.interface import CreateRequest, ProviderInstance
from activities.provider.simulator import Latency, SimulatedCloud
from agent.checkpoint import register
from agent.checkpoint.protocol import Saved
from agent.checkpoint.server import CheckpointServer
from agent.daemon import Agent
from agent.scheduler import Workload
from agent.sources.nats import NatsNoticeSource
from bench.report import Report
from contracts import bundle, keys
from contracts.cache import BundleCache
from contracts.keys import TrustStore
from contracts.model import EarlyWarningAction
from contracts.notice import NoticePolicy, notice_stream
from contracts.reclaim import ReclaimRequest
from contracts.region import Region, load_region
from contracts.source import read_contracts
from services.notice_relay.relay import NoticeRelay
from tests.support import services
from tests.support.agent_fakes import RecordingScheduler, agent_config, notice_key
from tests.support.control_harness import region_worker
from tests.support.paths import BASE_DSN, EXAMPLES
from workers.exit_now import run_and_exit
from workers.notice_hooks import NoticeHookConsumer
from workers.temporal_bootstrap import ensure_search_attributes
from workflows.controller.models import (
    ControllerConfig,
    ControllerInput,
    controller_workflow_id,
)
from workflows.controller.workflow import RegionControllerWorkflow

NATS_URL = "nats://127.0.0.1:4222"
CONTRACT = "llm-train"
DEMAND_UNITS = 6
LEAD_S, TICK_S, API_S, BOOT_S, STEP_S = 120.0, 60.0, 2.0, 180.0, 0.5
TARGET_REPLACED = 0.9
TARGET_LOST_STEPS = 1
PARTITIONS = 4


class Trainer:
    """A DCP-shaped job: a step at a time under a lock; a checkpoint saves the state at the
    current step (a file, as DCP writes a directory); it stops once the agent has its
    drain checkpoint (`answered`), or when its node is deleted under it."""

    def __init__(self, sock: Path, ckpt: Path, step_s: float) -> None:
        self.step = 0
        self.saves: list[int] = []
        self.lock = threading.Lock()
        self._ckpt, self._step_s = ckpt, step_s
        ckpt.mkdir(parents=True, exist_ok=True)
        self.server: CheckpointServer = register(self._save, socket_path=sock)
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._train, daemon=True)
        self._thread.start()

    def _save(self, reason: str, deadline: float) -> Saved:
        with self.lock:
            current = self.step
            target = self._ckpt / f"step-{current}"
            target.write_text(json.dumps({"step": current}))
            self.saves.append(current)
            return Saved(f"file://{target}", lost_steps=self.step - current)

    def _train(self) -> None:
        # No step once a drain's checkpoint is asked for (`draining`), as a DCP training
        # loop does; then it waits for the answer to be out (`answered`) and leaves.
        while not self.server.draining.is_set() and not self.stopped.is_set():
            with self.lock:
                self.step += 1
            time.sleep(self._step_s)

    def stop(self) -> int:
        """Stop (the node is gone); the steps lost: done since the last checkpoint."""
        self.stopped.set()
        self._thread.join(5)
        self.server.close()
        return self.step - (self.saves[-1] if self.saves else 0)


class TimedCloud(SimulatedCloud):
    """The simulated cloud, with the time of every create (the replacement's first call)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.create_times: list[float] = []

    async def create(self, request: CreateRequest) -> ProviderInstance:
        inst = await super().create(request)
        self.create_times.append(time.monotonic())
        return inst


@dataclass
class Trial:
    node: str
    planned_at: float
    hard_due: float  # real time the hard notice is due (reclaim time - lead)
    replaced_at: float | None = None
    created_at: float | None = None  # the replacement's create call at the provider
    hard_at: float | None = None
    early_saved: bool = False
    lost_steps: int | None = None
    detail: list[str] = field(default_factory=list)


def bench_region(tmp: Path) -> tuple[Path, Region]:
    """r1's pools under a region id of this run alone, so its NATS stream and subjects
    meet nobody else's on the shared server."""
    region_id = f"r{uuid.uuid4().int % 90000 + 10000}"
    text = (ROOT / "deploy" / "regions" / "r1.toml").read_text()
    text = text.replace('id = "r1"', f'id = "{region_id}"', 1)
    directory = tmp / "regions"
    directory.mkdir()
    (directory / f"{region_id}.toml").write_text(text)
    return directory, load_region(directory / f"{region_id}.toml")


def install_bundle(tmp: Path, region: Region, lead_s: int) -> tuple[Path, Path]:
    """The example contracts, llm-train opted in to early checkpoints and lent to this
    region, signed; the relay's notice key listed for the region. (cache dir, trust dir)"""
    _, private, _ = keys.generate(tmp / "trust")
    sources, findings = read_contracts(EXAMPLES)
    assert not findings, findings
    contracts = []
    for s in sources:
        c = s.contract
        if c.name == CONTRACT:
            drain = c.drain.model_copy(update={"early_warning": EarlyWarningAction.CHECKPOINT})
            c = c.model_copy(update={"regions": [region.id], "floor": {}, "drain": drain})
        contracts.append(c)
    relay_key = notice_key(tmp)
    raw = bundle.build(
        contracts,
        serial=1,
        created_at=datetime.now(UTC) - timedelta(minutes=1),
        key=keys.load_signing_key(private),
        notice_policies=[
            NoticePolicy(
                region=region.id,
                lead_seconds=lead_s,
                keys={
                    keys.key_id(relay_key.verify_key): relay_key.verify_key.encode(
                        HexEncoder
                    ).decode()
                },
            )
        ],
    )
    cache = tmp / "cache"
    assert BundleCache(cache, TrustStore.load(tmp / "trust")).offer(raw).accepted
    return cache, tmp / "trust"


def units(row: InstanceRow) -> int:
    return {"l": 1, "xl": 2, "2xl": 4, "4xl": 8}[row.size]


def staying_units(fleet: FleetRepository, region: str, leaving: set[str]) -> int:
    return sum(
        units(r)
        for r in fleet.list_instances(region, [InstanceState.ACTIVE])
        if r.workload == CONTRACT and r.instance_id not in leaving
    )


async def wait_for(check: object, within: float, step: float = 0.02) -> bool:
    assert callable(check)
    end = time.monotonic() + within
    while time.monotonic() < end:
        if check():
            return True
        await asyncio.sleep(step)
    return bool(check())


async def relay_loop(
    relays: list[NoticeRelay], stop: asyncio.Event, hard: dict[str, float]
) -> None:
    """What each hall's `sco notice-relay` does every sweep: due hard notices, deletes."""
    while not stop.is_set():
        for relay in relays:
            for notice in await relay.notice_planned():
                hard.setdefault(notice.node, time.monotonic())
            await relay.sweep()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


async def run_trial(
    k: float,
    warning_s: float,
    region: Region,
    cloud: TimedCloud,
    fleet: FleetRepository,
    relays: dict[str, NoticeRelay],
    hard: dict[str, float],
    leaving: set[str],
    tmp: Path,
) -> Trial:
    lead = LEAD_S / k
    candidates = [
        r
        for r in fleet.list_instances(region.id, [InstanceState.ACTIVE])
        if r.workload == CONTRACT and r.instance_id not in leaving
    ]
    row = candidates[0]
    relay = relays[row.hall]
    node_dir = tmp / row.instance_id
    cfg = agent_config(
        node_dir,
        node=row.instance_id,
        region=region.id,
        hall=row.hall,
        nats_urls=[NATS_URL],
        cache_dir=tmp / "cache",
        trust_dir=tmp / "trust",
        safety_margin_seconds=min(0.5, lead / 4),
    )
    job = uuid.uuid4().hex[:8]
    scheduler = RecordingScheduler(
        [
            Workload(
                id=job,
                socket_name=f"slurm_{job}",
                account="mlr",
                partition="spot",
                comment=f"sco-contract={CONTRACT}",
            )
        ]
    )
    agent = Agent(cfg, scheduler=scheduler)
    source = next(s for s in agent.sources if isinstance(s, NatsNoticeSource))
    trainer = Trainer(cfg.socket_dir / f"slurm_{job}/sock", node_dir / "ckpt", STEP_S / k)
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(source.watching.wait(), 30)
        await asyncio.sleep(10 * STEP_S / k)  # it has trained a while
        at = datetime.now(UTC) + timedelta(seconds=warning_s)
        t0 = time.monotonic()
        trial = Trial(row.instance_id, t0, t0 + warning_s - lead)
        warned = await relay.handle_request(
            ReclaimRequest(instances=[row.instance_id], at=at, requested_by="bench")
        )
        if not warned or not warned[0].early:
            trial.detail.append(f"no early warning: {warned}")
        leaving.add(row.instance_id)

        def replaced() -> bool:
            return staying_units(fleet, region.id, leaving) >= DEMAND_UNITS

        if await wait_for(replaced, warning_s + 30):
            trial.replaced_at = time.monotonic()
        trial.created_at = next((t for t in cloud.create_times if t >= t0), None)
        # The node goes at the deadline: the drain (at the hard notice) is over by then.
        gone = await wait_for(
            lambda: (
                (r := fleet.get_instance(row.instance_id)) is not None
                and r.state is InstanceState.DELETED
            ),
            warning_s + 30,
        )
        if not gone:
            trial.detail.append("the node was never deleted")
        trial.hard_at = hard.get(row.instance_id)
        early = [r for r in agent.reports if r.early]
        trial.early_saved = bool(early) and all(w.result == "saved" for w in early[0].workloads)
        drains = [r for r in agent.reports if not r.early]
        if not drains:
            trial.detail.append("no drain report (hard notice not acted on)")
        trial.lost_steps = await asyncio.to_thread(trainer.stop)
        return trial
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 30)
        trainer.stopped.set()


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--warning-min", type=float, default=10.0, help="modelled minutes ahead")
    ap.add_argument("--compression", type=float, default=12.0, help="modelled s per real s")
    ap.add_argument("--tiny", action="store_true", help="1 trial at 60x (CI smoke)")
    args = ap.parse_args()
    if args.tiny:
        args.trials, args.compression = 1, 60.0
    k = args.compression
    warning_s = args.warning_min * 60 / k
    lead_s = LEAD_S / k
    report = Report(
        "early_warning",
        {
            "trials": args.trials,
            "warning_min_modelled": args.warning_min,
            "compression": k,
            "real_s": {
                "warning": round(warning_s, 3),
                "lead": round(lead_s, 3),
                "tick": round(TICK_S / k, 3),
                "api_call": round(API_S / k, 4),
                "boot": round(BOOT_S / k, 3),
                "train_step": round(STEP_S / k, 4),
            },
        },
    )
    report.notes.append(
        "time compressed: warning, notice lead, tick, API latency, boot time and step time "
        f"all divided by {k:g}; Temporal, PostgreSQL and NATS run in real time (pessimistic)"
    )
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        data_converter=pydantic_data_converter,
        ui=False,
    )
    await ensure_search_attributes(env.client, env.client.namespace)
    dsn = services.scratch_database(BASE_DSN)
    nc = await nats.connect(NATS_URL)
    trials: list[Trial] = []
    region: Region | None = None
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            regions_dir, region = bench_region(tmp)
            migrate(dsn)
            pool = open_pool(dsn, max_size=8)
            fleet, control = FleetRepository(pool), ControlRepository(pool)
            fleet.sync_pools(region)
            cache, trust = install_bundle(tmp, region, max(1, math.ceil(lead_s)))
            loop = asyncio.get_running_loop()
            cloud = TimedCloud(
                region, latency=Latency(api_s=API_S / k, boot_s=BOOT_S / k), clock=loop.time
            )

            # The region worker's side: hard notices signal exclusion cycles on a queue
            # no worker polls here, early warnings wake the controller.
            hooks = NoticeHookConsumer(
                env.client, region.id, "unused", PARTITIONS, fetch_seconds=0.5
            )
            hooks_stop = asyncio.Event()
            relays = {
                hall: NoticeRelay(
                    region=region.id,
                    hall=hall,
                    lead=timedelta(seconds=lead_s),
                    repo=fleet,
                    provider=cloud,
                    js=nc.jetstream(),
                    signing_key=notice_key(tmp),
                )
                for hall in region.halls
            }
            await relays["A"].ensure_stream()
            async with region_worker(
                env.client,
                cloud,
                fleet,
                control,
                bundle_dir=cache,
                trust_dir=trust,
                regions_dir=regions_dir,
            ) as h:
                hooking = asyncio.create_task(hooks.run(nc.jetstream(), hooks_stop))
                partition = partition_of(CONTRACT, PARTITIONS)
                handle = await env.client.start_workflow(
                    RegionControllerWorkflow.run,
                    ControllerInput(
                        region=region.id,
                        partition=partition,
                        config=ControllerConfig(
                            tick_seconds=TICK_S / k,
                            partitions=PARTITIONS,
                            exact_plan_seconds=0,
                            build_timeout_seconds=900 / k,
                            acquisition_poll_seconds=1.0 / k,
                            release_idle_seconds=10**6,  # demand is constant here
                        ),
                    ),
                    id=controller_workflow_id(region.id, partition),
                    task_queue=h.queue,
                )
                control.set_demand(region.id, "cli", {CONTRACT: DEMAND_UNITS})
                leaving: set[str] = set()
                if not await wait_for(
                    lambda: staying_units(fleet, region.id, leaving) >= DEMAND_UNITS, 60
                ):
                    st = await handle.query(RegionControllerWorkflow.status)
                    report.measurement_missing(
                        "replaced_before_hard_notice",
                        f"the contract was never covered in the first place ({st.last})",
                        "%",
                        anchor="hard notice",
                        target=100 * TARGET_REPLACED,
                        comparator=">=",
                    )
                    return report.emit()
                hard: dict[str, float] = {}
                stop = asyncio.Event()
                # One relay per hall, as in production (each its own `sco notice-relay`).
                loop_task = asyncio.create_task(relay_loop(list(relays.values()), stop, hard))
                try:
                    for _ in range(args.trials):
                        trials.append(
                            await run_trial(
                                k,
                                warning_s,
                                region,
                                cloud,
                                fleet,
                                relays,
                                hard,
                                leaving,
                                tmp,
                            )
                        )
                finally:
                    stop.set()
                    await loop_task
                    hooks_stop.set()
                    await hooking
                    await handle.terminate()
            pool.close()
    finally:
        await nc.close()
        if region is not None:
            with contextlib.suppress(Exception):
                nc2 = await nats.connect(NATS_URL)
                await nc2.jetstream().delete_stream(notice_stream(region.id))
                await nc2.close()
        services.drop_database(dsn)
        await env.shutdown()
    summarise(report, trials, warning_s, k)
    return report.emit()


def summarise(report: Report, trials: list[Trial], warning_s: float, k: float) -> None:
    anchor = "the hard notice (reclaim time - lead): replacement ACTIVE before it"
    if not trials:
        report.measurement_missing(
            "replaced_before_hard_notice",
            "no trial ran",
            "%",
            anchor=anchor,
            target=100 * TARGET_REPLACED,
            comparator=">=",
        )
        return
    ok = [t for t in trials if t.replaced_at is not None and t.replaced_at <= t.hard_due]
    report.figure(
        "replaced_before_hard_notice",
        100 * len(ok) / len(trials),
        "%",
        anchor=f"{anchor}; {len(trials)} planned reclaims, {warning_s * k / 60:g} min ahead",
        target=100 * TARGET_REPLACED,
        comparator=">=",
    )
    leads = [(t.replaced_at - t.planned_at) * k for t in trials if t.replaced_at is not None]
    if leads:
        report.figure(
            "warning_to_replacement_active_p50",
            statistics.median(leads),
            "modelled s",
            anchor="early warning sent (the plan written) to replacement ACTIVE",
        )
    lost = [t.lost_steps for t in trials if t.lost_steps is not None]
    if len(lost) < len(trials):
        report.measurement_missing(
            "lost_steps_max",
            f"{len(trials) - len(lost)} trials without a job outcome",
            "steps",
            anchor="the job's last checkpoint",
            target=TARGET_LOST_STEPS,
            comparator="<=",
        )
    else:
        report.figure(
            "lost_steps_max",
            max(lost),
            "steps",
            anchor="per reclaim: steps done after the checkpoint a requeued job resumes from",
            target=TARGET_LOST_STEPS,
            comparator="<=",
        )
    report.figure(
        "early_checkpoints_saved",
        100 * sum(t.early_saved for t in trials) / len(trials),
        "%",
        anchor="trials whose job saved on the early warning and kept training",
    )
    report.details["trials"] = [
        {
            "node": t.node,
            "replaced_modelled_s_after_warning": None
            if t.replaced_at is None
            else round((t.replaced_at - t.planned_at) * k, 1),
            "first_create_modelled_s_after_warning": None
            if t.created_at is None
            else round((t.created_at - t.planned_at) * k, 1),
            "hard_notice_modelled_s_after_warning": None
            if t.hard_at is None
            else round((t.hard_at - t.planned_at) * k, 1),
            "lost_steps": t.lost_steps,
            "early_saved": t.early_saved,
            "detail": t.detail,
        }
        for t in trials
    ]


if __name__ == "__main__":
    run_and_exit(lambda: asyncio.run(main()))  # no teardown: Temporal's threads abort it
