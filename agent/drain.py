"""The drain engine: cordon the node, tell every workload, wait a bounded time, force.

Per workload, by its contract's `drain.action`:
    checkpoint    ask over its checkpoint socket; when it answers ok, requeue it; when it
                  does not answer within the bound (or has no socket, answers anything but
                  protocol v1, or its socket is not the job's: agent.checkpoint.peer),
                  force it. Whatever fails, a workload ends requeued or forced (or failed,
                  when the scheduler itself refuses to force it), never left as it was
    decommission  ask it to decommission (Spark: SIGPWR to the executor, see
                  agent.checkpoint.spark) and wait for it to leave the node; force after
    requeue       requeue now (a job that registered a socket is told first, bounded)
The bound is min(grace_seconds, deadline - now - safety margin), never negative. A job
under no contract (contracts.matching: the rule the control plane counts demand by), and
every job when there is no valid bundle, is requeued: the conservative default. Workloads
are drained concurrently; dry-run is checked by the scheduler on every mutating call and
here before telling a workload anything.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.checkpoint import naming
from agent.checkpoint.client import send_request
from agent.checkpoint.peer import PeerRefused
from agent.checkpoint.protocol import ProtocolError, Request
from agent.notices import Notice
from agent.scheduler import NodeScheduler, SchedulerError, Workload
from contracts.drain_terms import DrainAction, EarlyWarningAction
from contracts.matching import match_contract
from contracts.node_bundle import NodeBundle

log = logging.getLogger(__name__)

#: No bundle, or no contract for the job: requeue, with this grace for the eviction.
DEFAULT_ACTION = DrainAction.REQUEUE
DEFAULT_GRACE_SECONDS = 30
_POLL_GONE_SECONDS = 0.5
# How often a refused eviction (a PodDisruptionBudget answering 429) is asked again.
_RETRY_REQUEUE_SECONDS = 1.0


@dataclass
class WorkloadOutcome:
    workload: str
    contract: str | None
    action: str
    # checkpointed, decommissioned, requeued, forced, gone, failed, dry-run; on an early
    # warning: saved (checkpoint taken, still running), decommissioned, failed
    result: str = "pending"
    told_ms: float | None = None  # since the notice reached the engine
    path: str = ""
    detail: str = ""
    # Lost work (None: not known). Steps and tasks as the workload's adapter reports them
    # in its answer; seconds of run time thrown away by a requeue or a force, when the
    # scheduler knows when the workload started.
    lost_steps: int | None = None
    lost_tasks: int | None = None
    lost_seconds: float | None = None


@dataclass
class DrainReport:
    notice_id: str
    node: str
    source: str
    deadline: str
    bundle_serial: int | None
    conservative: bool
    dry_run: bool
    cordoned: bool = False
    cordon_ms: float | None = None
    all_told_ms: float | None = None
    finished_ms: float | None = None
    finished_at: str = ""  # wall clock, ISO 8601: when lost work is booked in the ledger
    error: str = ""
    workloads: list[WorkloadOutcome] = field(default_factory=list)

    early: bool = False  # the report of an early warning, not of a drain

    def as_event(self) -> dict[str, Any]:
        return {
            "event": "early_warning_handled" if self.early else "drain_finished",
            **asdict(self),
        }


class DrainEngine:
    def __init__(
        self,
        scheduler: NodeScheduler,
        socket_dir: Path,
        *,
        dry_run: bool,
        safety_margin_seconds: float,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._scheduler = scheduler
        self._socket_dir = socket_dir
        self._dry_run = dry_run
        self._margin = safety_margin_seconds
        self._clock = clock

    def bound(self, grace_seconds: float, deadline: datetime) -> float:
        left = (deadline - self._clock()).total_seconds() - self._margin
        return max(0.0, min(float(grace_seconds), left))

    def _report(
        self,
        notice: Notice,
        bundle: NodeBundle | None,
        serial: int | None,
        *,
        early: bool = False,
    ) -> DrainReport:
        """The report of one notice, before any workload is acted on."""
        return DrainReport(
            notice_id=notice.notice_id,
            node=notice.node,
            source=notice.source,
            deadline=notice.deadline.isoformat(),
            bundle_serial=serial,
            conservative=bundle is None,
            dry_run=self._dry_run,
            early=early,
        )

    async def early(
        self, notice: Notice, bundle: NodeBundle | None, serial: int | None
    ) -> DrainReport:
        """An early warning: the node stays usable, only workloads whose contract opts in
        (`drain.early_warning`) act now. `checkpoint`: a checkpoint saved now and the job
        goes on (the hard notice's drain saves again, so at most the steps between that
        save and the deadline are at stake). `decommission`: the node is cordoned (a Spark
        executor that left must not be placed back on a doomed node) and the job leaves
        as in a drain. Without a bundle nothing opts in, so nothing happens."""
        start = time.monotonic()

        def ms() -> float:
            return round((time.monotonic() - start) * 1000, 3)

        report = self._report(notice, bundle, serial, early=True)
        try:
            workloads = [] if bundle is None else await self._scheduler.workloads(notice.node)
        except SchedulerError as exc:
            log.error("cannot list workloads on %s: %s", notice.node, exc)
            report.error = f"list: {exc}"
            workloads = []
        opted: list[tuple[Workload, WorkloadOutcome, int, EarlyWarningAction]] = []
        for w in workloads:
            assert bundle is not None
            contract = match_contract(bundle.contracts, w.identity())
            if isinstance(contract, str) or contract.drain.early_warning is EarlyWarningAction.NONE:
                continue
            early = contract.drain.early_warning
            outcome = WorkloadOutcome(w.id, contract.name, f"early_{early.value}")
            opted.append((w, outcome, contract.drain.grace_seconds, early))
        report.workloads = [o for _, o, _, _ in opted]
        if any(e is EarlyWarningAction.DECOMMISSION for *_, e in opted):
            try:
                await self._scheduler.cordon(notice.node, f"sco early warning {notice.notice_id}")
                report.cordoned = True
            except SchedulerError as exc:
                log.error("cordon of %s failed: %s", notice.node, exc)
                report.error = (report.error + "; " if report.error else "") + f"cordon: {exc}"
        report.cordon_ms = ms()
        await asyncio.gather(*(self._early_one(notice, *item, ms) for item in opted))
        told = [o.told_ms for o in report.workloads if o.told_ms is not None]
        report.all_told_ms = max(told) if told else report.cordon_ms
        report.finished_ms = ms()
        report.finished_at = self._clock().isoformat()
        return report

    async def _early_one(
        self,
        notice: Notice,
        workload: Workload,
        outcome: WorkloadOutcome,
        grace: int,
        early: EarlyWarningAction,
        ms: Callable[[], float],
    ) -> None:
        bound = self.bound(grace, notice.deadline)
        sock = naming.job_socket(self._socket_dir, workload.socket_name)
        try:
            if early is EarlyWarningAction.CHECKPOINT:
                saved = await self._tell(
                    notice, workload, sock, "early_checkpoint", bound, outcome, ms
                )
                # Not "checkpointed": the job keeps running and drains at the hard notice.
                outcome.result = ("dry-run" if self._dry_run else "saved") if saved else "failed"
                return
            if not await self._tell(notice, workload, sock, "decommission", bound, outcome, ms):
                outcome.result = "failed"  # it stays; the hard notice drains it
                return
            if self._dry_run:
                outcome.result = "dry-run"
            elif await self._wait_gone(notice.node, workload, time.monotonic() + bound):
                outcome.result = "decommissioned"
            else:
                outcome.result = "failed"
                outcome.detail = (
                    "still on the node after the grace period (the hard notice drains it)"
                )
        except Exception as exc:  # one workload's failure never stops the others
            log.exception("early warning for %s failed", workload.id)
            outcome.result = "failed"
            outcome.detail = f"{type(exc).__name__}: {exc}"

    async def drain(
        self, notice: Notice, bundle: NodeBundle | None, serial: int | None
    ) -> DrainReport:
        start = time.monotonic()

        def ms() -> float:
            return round((time.monotonic() - start) * 1000, 3)

        report = self._report(notice, bundle, serial)
        reason = f"sco reclaim {notice.notice_id} by {notice.deadline.isoformat()}"
        try:
            await self._scheduler.cordon(notice.node, reason)
            report.cordoned = True
        except SchedulerError as exc:
            # Keep going: the workloads still have to leave before the deadline.
            log.error("cordon of %s failed: %s", notice.node, exc)
            report.error = f"cordon: {exc}"
        report.cordon_ms = ms()
        try:
            workloads = await self._scheduler.workloads(notice.node)
        except SchedulerError as exc:
            log.error("cannot list workloads on %s: %s", notice.node, exc)
            report.error = (report.error + "; " if report.error else "") + f"list: {exc}"
            workloads = []
        outcomes = [self._plan(w, bundle) for w in workloads]
        report.workloads = [o for o, _, _ in outcomes]
        await asyncio.gather(
            *(self._drain_one(notice, w, o, grace, ms) for o, w, grace in outcomes)
        )
        told = [o.told_ms for o in report.workloads if o.told_ms is not None]
        report.all_told_ms = max(told) if told else report.cordon_ms
        report.finished_ms = ms()
        report.finished_at = self._clock().isoformat()
        return report

    def _plan(
        self, workload: Workload, bundle: NodeBundle | None
    ) -> tuple[WorkloadOutcome, Workload, int]:
        if bundle is None:
            outcome = WorkloadOutcome(workload.id, None, DEFAULT_ACTION.value)
            return outcome, workload, DEFAULT_GRACE_SECONDS
        contract = match_contract(bundle.contracts, workload.identity())
        if isinstance(contract, str):
            log.warning(
                "%s runs under no contract (%s): requeued by default", workload.id, contract
            )
            outcome = WorkloadOutcome(workload.id, None, DEFAULT_ACTION.value, detail=contract)
            return outcome, workload, DEFAULT_GRACE_SECONDS
        outcome = WorkloadOutcome(workload.id, contract.name, contract.drain.action.value)
        return outcome, workload, contract.drain.grace_seconds

    async def _drain_one(
        self,
        notice: Notice,
        workload: Workload,
        outcome: WorkloadOutcome,
        grace: int,
        ms: Callable[[], float],
    ) -> None:
        action = DrainAction(outcome.action)
        bound = self.bound(grace, notice.deadline)
        until = time.monotonic() + bound
        sock = naming.job_socket(self._socket_dir, workload.socket_name)
        try:
            if action is DrainAction.REQUEUE and not _exists(sock):
                outcome.told_ms = ms()
                await self._requeue(notice, workload, grace, outcome, until)
                return
            op = "decommission" if action is DrainAction.DECOMMISSION else "checkpoint"
            answered = await self._tell(notice, workload, sock, op, bound, outcome, ms)
            if action is DrainAction.DECOMMISSION and answered and self._dry_run:
                outcome.result = "dry-run"
                return
            if action is DrainAction.DECOMMISSION and answered:
                if await self._wait_gone(notice.node, workload, until):
                    outcome.result = "decommissioned"
                    return
                outcome.detail = "still on the node after the grace period"
                answered = False
            if answered or action is DrainAction.REQUEUE:
                await self._requeue(notice, workload, grace, outcome, until)
                if answered and outcome.result == "requeued" and action is DrainAction.CHECKPOINT:
                    outcome.result = "checkpointed"
                return
            await self._force(workload, outcome)
        except Exception as exc:  # one workload's failure never stops the others
            log.exception("drain of %s failed", workload.id)
            outcome.detail = f"{type(exc).__name__}: {exc}"
            if outcome.result in ("requeued", "checkpointed", "forced", "gone", "dry-run"):
                return
            # Whatever went wrong, the job does not stay on a node that is going away.
            try:
                await self._force(workload, outcome)
            except Exception as force_exc:  # the scheduler itself fails: say so
                log.exception("force of %s failed", workload.id)
                outcome.result = "failed"
                outcome.detail += f"; force: {type(force_exc).__name__}: {force_exc}"

    async def _tell(
        self,
        notice: Notice,
        workload: Workload,
        sock: Path,
        op: str,
        bound: float,
        outcome: WorkloadOutcome,
        ms: Callable[[], float],
    ) -> bool:
        if not _exists(sock):
            outcome.told_ms = ms()
            outcome.detail = "no checkpoint socket"
            return False
        deadline = time.time() + bound
        if self._dry_run:
            log.info("dry-run: would send %s to %s (deadline in %.1fs)", op, sock, bound)
            outcome.told_ms = ms()
            return True
        request = Request(op, notice.reason or "reclaim", deadline, notice.notice_id)
        outcome.told_ms = ms()
        try:
            reply = await send_request(sock, request, bound, workload.owner())
        except TimeoutError:
            outcome.detail = f"no answer to {op} within {bound:.1f}s"
            return False
        except PeerRefused as exc:
            log.error("%s: checkpoint socket refused: %s", workload.id, exc)
            outcome.detail = f"{op} not sent, not the job's socket: {exc}"
            return False
        except (OSError, ProtocolError) as exc:
            outcome.detail = f"{op} request failed: {exc}"
            return False
        except Exception as exc:  # whatever a reply does, it is no answer: the job is forced
            log.exception("%s: %s request failed", workload.id, op)
            outcome.detail = f"{op} request failed: {type(exc).__name__}: {exc}"
            return False
        if not reply.ok:
            outcome.detail = f"{op} refused: {reply.error}"
            return False
        outcome.path = reply.path
        outcome.lost_steps, outcome.lost_tasks = reply.lost_steps, reply.lost_tasks
        return True

    async def _wait_gone(self, node: str, workload: Workload, until: float) -> bool:
        while True:
            try:
                present = {w.id for w in await self._scheduler.workloads(node)}
            except SchedulerError as exc:
                log.warning("cannot check whether %s left: %s", workload.id, exc)
                present = {workload.id}
            if workload.id not in present:
                return True
            if time.monotonic() >= until:
                return False
            await asyncio.sleep(min(_POLL_GONE_SECONDS, max(0.0, until - time.monotonic())))

    async def _requeue(
        self,
        notice: Notice,
        workload: Workload,
        grace: int,
        outcome: WorkloadOutcome,
        until: float,
    ) -> None:
        """Evict/requeue with the grace the deadline leaves. A refusal worth retrying (a
        PodDisruptionBudget's 429, a conflict, a 5xx) is retried until `until` (the
        workload's grace, bounded by the notice deadline less the margin); only then is
        the workload forced, as the node goes at the deadline either way."""
        blocked_since: float | None = None
        while True:
            bounded_grace = max(1, int(self.bound(grace, notice.deadline)))
            try:
                await self._scheduler.requeue(workload, bounded_grace)
                outcome.result = "dry-run" if self._dry_run else "requeued"
                if outcome.path == "":  # nothing saved: its run so far is done again
                    outcome.lost_seconds = self._run_seconds(workload)
                if blocked_since is not None:
                    outcome.detail = (
                        f"eviction refused for {time.monotonic() - blocked_since:.1f}s "
                        "(disruption budget), then allowed"
                    )
                return
            except SchedulerError as exc:
                if exc.not_found:
                    outcome.result = "gone"
                    return
                left = until - time.monotonic()
                if not exc.retryable or left <= 0:
                    blocked = "" if blocked_since is None else " after retrying until the bound"
                    log.warning("requeue of %s failed%s (%s); forcing", workload.id, blocked, exc)
                    outcome.detail = f"requeue failed{blocked}: {exc}"
                    await self._force(workload, outcome)
                    return
                if blocked_since is None:
                    blocked_since = time.monotonic()
                    log.info(
                        "requeue of %s refused (%s); retrying for %.1fs", workload.id, exc, left
                    )
                await asyncio.sleep(min(_RETRY_REQUEUE_SECONDS, left))

    async def _force(self, workload: Workload, outcome: WorkloadOutcome) -> None:
        await self._scheduler.force(workload)
        outcome.result = "dry-run" if self._dry_run else "forced"
        outcome.lost_seconds = self._run_seconds(workload)

    def _run_seconds(self, workload: Workload) -> float | None:
        if workload.started_at is None:
            return None
        return round(max(0.0, (self._clock() - workload.started_at).total_seconds()), 3)


def _exists(path: Path) -> bool:
    # One stat of a local socket file: cheap enough for the event loop. A symlink counts as
    # there (and is then refused by the peer check): nothing in a job's place goes unseen.
    return os.path.lexists(path)
