"""The programs slurmctld runs for power saving: resume, suspend, resume-failed.

`deploy/slurm/sco-resume` (ResumeProgram), `sco-suspend` (SuspendProgram) and
`sco-resume-fail` (ResumeFailProgram) run
`python -m workers.slurm_power_programs <verb> HOSTLIST`. This module imports only what
these need (no CLI framework, no worker), because Slurm's resume request should become a
started acquisition within about a second.

- resume: one AcquisitionWorkflow per contract, launching one instance per node with the
  node's name as hostname and user-data that starts slurmd. Nodes SCO will not bring up
  (no pool feature, no job, no contract) are set DOWN at once with the reason, so Slurm
  requeues their jobs instead of waiting ResumeTimeout.
- suspend: the instances behind the nodes are released by a SlurmReleaseWorkflow.
- resume-failed: the same, and each failure counts against the node's pool in its
  exclusion cycle, as a reclaim does.

Exit status 0 when everything asked was handed over, 1 when some nodes were refused or
failed, 2 on bad input or configuration. One JSON line per call goes to stdout (slurmctld
discards it; `sco slurm ...` shows it) and to `slurm.log_file` when set.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy

from activities.control.partition import partition_of
from activities.demand.hostlist import HostlistError, expand
from activities.demand.slurm_resume import (
    ResumePlan,
    SlurmCommands,
    SlurmError,
    plan_resume,
    render_user_data,
)
from activities.fleet.control_state import FINISHED_ACQUISITION_STATES
from activities.fleet.repository import InstanceRow
from contracts.bundle import installed_bundle
from contracts.region import RegionFileError, load_region
from workers.client_security import postgres_conninfo
from workers.exit_now import run_and_exit
from workers.settings import Settings, SettingsError, load_settings
from workers.temporal_connect import connect_temporal
from workflows.acquisition.models import (
    CANCEL_UPDATE,
    AcquisitionInput,
    LaunchItem,
    OperatorInput,
)
from workflows.slurm.models import NodeInstance, ReleaseReason, SlurmReleaseInput

ACQUISITION_PREFIX = "slurm-"
RELEASE_PREFIX = "slurm-release-"


class ProgramError(RuntimeError):
    """Bad input or configuration: nothing was done."""


class Report(BaseModel):
    verb: str
    region: str
    nodes: list[str]
    started: list[str] = []  # workflow ids
    cancelled: list[str] = []  # acquisitions still launching, cancelled
    released: list[str] = []  # instance ids handed to a release workflow
    refused: dict[str, str] = {}  # node -> why
    in_flight: list[str] = []  # nodes an acquisition is still bringing up: left to it
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.refused


# -- resume ----------------------------------------------------------------------------


async def resume(
    s: Settings, hostlist: str, *, resume_file: str | None = None, client: Client | None = None
) -> Report:
    t0 = time.monotonic()
    nodes = _nodes(hostlist)
    report = Report(verb="resume", region=s.region, nodes=nodes)
    bundle, problem = installed_bundle(s.bundle_cache_dir, s.trust_dir)
    if bundle is None:
        raise ProgramError(problem)
    try:
        region = load_region(s.region_file())
    except (RegionFileError, OSError) as exc:
        raise ProgramError(f"region file {s.region_file()}: {exc}") from exc
    cmds = _commands(s)
    text = _read_resume_file(resume_file)
    # Connecting to Temporal overlaps the Slurm reads: the resume is on the clock.
    client_task = asyncio.ensure_future(_given(client) if client else _connect(s))
    try:
        node_info, node_jobs, (rows, open_acqs) = await asyncio.gather(
            cmds.nodes(), cmds.node_jobs(nodes, text), asyncio.to_thread(_fleet_rows, s, nodes)
        )
    except SlurmError as exc:
        client_task.cancel()
        raise ProgramError(str(exc)) from exc
    # One instance per node: a node still being brought up is left to that acquisition; an
    # instance left from an earlier life of the node (a suspend that never reached SCO) is
    # released before a new one is made, so two instances never claim one node name.
    report.in_flight = sorted({r.hostname or "" for r in rows if r.acquisition_id in open_acqs})
    stale = [r for r in rows if r.acquisition_id not in open_acqs]
    wanted = [n for n in nodes if n not in report.in_flight]
    plan = plan_resume(wanted, node_info, node_jobs, bundle.content.contracts, region)
    if plan.groups or stale:
        try:
            temporal = await client_task
        except RuntimeError as exc:
            raise ProgramError(f"cannot reach Temporal at {s.temporal.address}: {exc}") from exc
        if stale:
            report.started.append(await _start_release(s, temporal, stale, ReleaseReason.REPLACED))
            report.released = [r.instance_id for r in stale]
        report.started += await _start_acquisitions(s, temporal, plan)
    else:
        client_task.cancel()
    report.refused = dict(plan.refused)
    if plan.refused:
        await _set_down(cmds, plan.refused)
    report.seconds = round(time.monotonic() - t0, 3)
    return report


async def _start_acquisitions(s: Settings, client: Client, plan: ResumePlan) -> list[str]:
    by_contract: dict[str, list[Any]] = {}
    for group in plan.groups:
        by_contract.setdefault(group.contract, []).append(group)
    user_data = render_user_data(s.slurm.user_data, slurmctld=s.slurm.slurmctld)
    started = []
    for contract, groups in sorted(by_contract.items()):
        nodes = [n for g in groups for n in g.nodes]
        inp = AcquisitionInput(
            region=s.region,
            partition=partition_of(contract, s.control.partitions),
            contract=contract,
            tier=groups[0].tier,
            items=[
                LaunchItem(
                    pool_id=g.pool_id,
                    hall=g.hall,
                    flavor=g.flavor,
                    instances=len(g.nodes),
                    units=g.units,
                    hostnames=g.nodes,
                    user_data=user_data,
                )
                for g in groups
            ],
            poll_seconds=s.slurm.poll_seconds,
        )
        # A new resume of the same nodes is a new acquisition: the time keeps ids apart.
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")[:-3]
        wid = f"{ACQUISITION_PREFIX}{s.region}-{contract}-{stamp}-{_digest(nodes)}"
        handle: WorkflowHandle[Any, Any] = await client.start_workflow(
            "AcquisitionWorkflow",
            inp,
            id=wid,
            task_queue=s.temporal.task_queue(s.region),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        started.append(handle.id)
    return started


async def _set_down(cmds: SlurmCommands, refused: dict[str, str]) -> None:
    by_reason: dict[str, list[str]] = {}
    for node, why in refused.items():
        by_reason.setdefault(why, []).append(node)
    for why, nodes in by_reason.items():
        try:
            await cmds.run(
                "scontrol",
                "update",
                f"nodename={','.join(nodes)}",
                "state=DOWN",
                f"reason=sco: {why}"[:200],
            )
        except SlurmError as exc:  # Slurm still fails them at ResumeTimeout
            print(f"sco slurm resume: cannot set {nodes} down: {exc}", file=sys.stderr)


# -- suspend and resume-failed ---------------------------------------------------------


async def release(
    s: Settings, hostlist: str, reason: ReleaseReason, *, client: Client | None = None
) -> Report:
    """Release the instances behind the nodes (SuspendProgram, ResumeFailProgram)."""
    t0 = time.monotonic()
    nodes = _nodes(hostlist)
    verb = "suspend" if reason is ReleaseReason.SUSPEND else "resume-failed"
    report = Report(verb=verb, region=s.region, nodes=nodes)
    rows, open_acqs = await asyncio.to_thread(_fleet_rows, s, nodes)
    temporal = client or await _connect(s)
    # An acquisition still launching owns its instances: cancelling it deletes them.
    for acq in sorted(open_acqs):
        try:
            await temporal.get_workflow_handle(acq).execute_update(
                CANCEL_UPDATE, OperatorInput(operator="slurm", reason=verb)
            )
            report.cancelled.append(acq)
        except Exception as exc:  # finished meanwhile: its instances are released below
            print(f"sco slurm {verb}: cancel {acq}: {exc}", file=sys.stderr)
    done = [r for r in rows if r.acquisition_id not in report.cancelled]
    if done:
        report.started.append(await _start_release(s, temporal, done, reason))
        report.released = [r.instance_id for r in done]
    if reason is ReleaseReason.RESUME_FAILED:
        await _count_failures(s, temporal, nodes, rows)
    report.seconds = round(time.monotonic() - t0, 3)
    return report


async def _start_release(
    s: Settings, client: Client, rows: list[InstanceRow], reason: ReleaseReason
) -> str:
    """A SlurmReleaseWorkflow for these instances; its id is derived from them, so a
    repeated call finds the same workflow."""
    inp = SlurmReleaseInput(
        region=s.region,
        reason=reason,
        instances=[
            NodeInstance(
                instance_id=r.instance_id,
                hostname=r.hostname or "",
                pool_id=r.pool_id,
                workload=r.workload,
                provider_id=r.provider_id,
                price_per_hour=r.price_per_hour,
            )
            for r in rows
        ],
    )
    handle: WorkflowHandle[Any, Any] = await client.start_workflow(
        "SlurmReleaseWorkflow",
        inp,
        id=f"{RELEASE_PREFIX}{s.region}-{reason.value}-" + _digest([r.instance_id for r in rows]),
        task_queue=s.temporal.task_queue(s.region),
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return handle.id


async def _count_failures(
    s: Settings, client: Client, nodes: list[str], rows: list[InstanceRow]
) -> None:
    """Each failed node counts once against its pool's exclusion cycle."""
    from workflows.exclusion.client import notify_reclaim

    pools = {r.hostname: (r.pool_id, r.instance_id) for r in rows}
    missing = [n for n in nodes if n not in pools]
    if missing:  # no instance (the create failed): the pool from the node's features
        try:
            info = await _commands(s).nodes()
        except SlurmError as exc:
            print(f"sco slurm resume-failed: {exc}", file=sys.stderr)
            info = {}
        now_key = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        for node in missing:
            pool_id = info[node].pool_id if node in info else None
            if pool_id:
                pools[node] = (pool_id, f"{node}@{now_key}")
    at = datetime.now(UTC)
    for pool_id, key in sorted(set(pools.values())):
        await notify_reclaim(client, s.region, s.temporal.task_queue(s.region), pool_id, key, at)


def _fleet_rows(s: Settings, nodes: list[str]) -> tuple[list[InstanceRow], set[str]]:
    from activities.fleet.control_state import ControlRepository
    from activities.fleet.db import open_pool
    from activities.fleet.repository import FleetRepository

    pool = open_pool(postgres_conninfo(s), min_size=1, max_size=2, timeouts=s.fleet_db.timeouts())
    try:
        rows = FleetRepository(pool).live_by_hostname(s.region, nodes)
        control = ControlRepository(pool)
        open_acqs = set()
        for acq_id in {r.acquisition_id for r in rows if r.acquisition_id}:
            acq = control.get_acquisition(acq_id)
            if acq is not None and acq.state not in FINISHED_ACQUISITION_STATES:
                open_acqs.add(acq_id)
        return rows, open_acqs
    finally:
        pool.close()


# -- plumbing --------------------------------------------------------------------------


def _nodes(hostlist: str) -> list[str]:
    try:
        nodes = expand(hostlist)
    except HostlistError as exc:
        raise ProgramError(str(exc)) from exc
    if not nodes:
        raise ProgramError("no nodes given (expected a Slurm hostlist)")
    return nodes


def _commands(s: Settings) -> SlurmCommands:
    return SlurmCommands(
        bin_dir=str(s.slurm.bin_dir) if s.slurm.bin_dir else None,
        slurm_conf=str(s.slurm.slurm_conf) if s.slurm.slurm_conf else None,
    )


def _read_resume_file(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:  # fall back to squeue: Slurm names the jobs there too
        print(f"sco slurm resume: SLURM_RESUME_FILE {path}: {exc}", file=sys.stderr)
        return None


async def _connect(s: Settings) -> Client:
    return await connect_temporal(s, s.temporal.namespace(s.region))


async def _given(client: Client) -> Client:
    return client


def _digest(items: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(sorted(items)).encode()).hexdigest()[:10]


async def run(verb: str, hostlist: str, s: Settings) -> Report:
    if verb == "resume":
        return await resume(s, hostlist, resume_file=os.environ.get("SLURM_RESUME_FILE"))
    if verb == "suspend":
        return await release(s, hostlist, ReleaseReason.SUSPEND)
    if verb == "resume-failed":
        return await release(s, hostlist, ReleaseReason.RESUME_FAILED)
    raise ProgramError(f"unknown verb {verb!r}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers.slurm_power_programs",
        description="SCO's Slurm power-saving programs (ResumeProgram and friends).",
    )
    parser.add_argument("verb", choices=["resume", "suspend", "resume-failed"])
    parser.add_argument("hostlist", help="the Slurm hostlist slurmctld passes")
    args = parser.parse_args(argv)
    try:
        s = load_settings()
    except SettingsError as exc:
        _log({"verb": args.verb, "hostlist": args.hostlist, "error": str(exc)}, None)
        return 2
    try:
        report = asyncio.run(run(args.verb, args.hostlist, s))
    except ProgramError as exc:
        _log({"verb": args.verb, "hostlist": args.hostlist, "error": str(exc)}, s)
        return 2
    _log(report.model_dump(), s)
    return 0 if report.ok else 1


def _log(entry: dict[str, Any], s: Settings | None) -> None:
    line = json.dumps({"at": datetime.now(UTC).isoformat(), **entry}, default=str)
    print(line, file=sys.stderr if "error" in entry else sys.stdout)
    if s is not None and s.slurm.log_file is not None:
        with open(s.slurm.log_file, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


if __name__ == "__main__":
    # Slurm logs a program that dumps core as failed: no teardown (workers/exit_now.py).
    run_and_exit(main)
