"""Slurm through its command-line clients (scontrol, squeue), as the node's admin would.

Jobs are listed with `squeue --nodelist <node> -o` in a fixed `|`-separated format (the
JSON output needs a plugin not every site builds), start times as Unix seconds
(SLURM_TIME_FORMAT=%s: the controller's local time has no zone in it). Clients read
SLURM_CONF from the environment as usual.
"""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import UTC, datetime

from agent.checkpoint import naming
from agent.scheduler import SchedulerError, Workload

log = logging.getLogger(__name__)

# %i job id (an array task's as <base>_<index>), %A the unique job id (SLURM_JOB_ID in the
# job: its checkpoint socket's name and its cgroup's), %a account, %P partition, %T state,
# %S start time (Unix seconds, see _TIME_ENV), %U and %G the job's numeric user and group
# (its checkpoint socket's only peer), %k comment (last: it may contain '|').
_FORMAT = "%i|%A|%a|%P|%T|%S|%U|%G|%k"
_TIME_ENV = {"SLURM_TIME_FORMAT": "%s"}
_ACTIVE = {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING"}
_GONE = ("invalid job id", "already completed", "is pending execution", "job has finished")


class SlurmScheduler:
    kind = "slurm"

    def __init__(self, *, dry_run: bool, timeout: float = 15.0, cgroup_check: bool = False) -> None:
        self.dry_run = dry_run
        self._timeout = timeout
        # The process answering for a job must run in the job's cgroup (proctrack/cgroup or
        # task/cgroup: .../job_<id>/...): another process of the same user cannot answer.
        self._cgroup_check = cgroup_check

    async def _run(self, *args: str) -> str:
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **_TIME_ENV},
            )
        except OSError as exc:
            raise SchedulerError(f"{args[0]}: {exc.strerror}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self._timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise SchedulerError(f"{' '.join(args)}: timed out", retryable=True) from None
        if proc.returncode != 0:
            message = err.decode(errors="replace").strip() or out.decode(errors="replace")
            gone = any(g in message.lower() for g in _GONE)
            raise SchedulerError(f"{' '.join(args)}: {message}", not_found=gone, retryable=True)
        return out.decode(errors="replace")

    async def cordon(self, node: str, reason: str) -> None:
        argv = ("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
        if self.dry_run:
            log.info("dry-run: would run %s", " ".join(argv))
            return
        await self._run(*argv)

    async def workloads(self, node: str) -> list[Workload]:
        out = await self._run("squeue", "--noheader", "--nodelist", node, "-o", _FORMAT)
        found = []
        for line in out.splitlines():
            parts = line.split("|", 8)
            if len(parts) != 9 or parts[4] not in _ACTIVE:
                continue
            job_id, unique_id, account, partition, _, start, uid, gid, comment = parts
            found.append(
                Workload(
                    id=job_id,
                    socket_name=naming.slurm_job(unique_id),
                    account=account,
                    partition=partition,
                    comment="" if comment == "(null)" else comment,
                    started_at=_started_at(start),
                    uid=_id(uid),
                    gid=_id(gid),
                    cgroup_markers=(f"/job_{unique_id}/",) if self._cgroup_check else (),
                )
            )
        return found

    async def requeue(self, workload: Workload, grace_seconds: int) -> None:
        if self.dry_run:
            log.info("dry-run: would run scontrol requeue %s", workload.id)
            return
        await self._run("scontrol", "requeue", workload.id)

    async def force(self, workload: Workload) -> None:
        if self.dry_run:
            log.info("dry-run: would force job %s off the node", workload.id)
            return
        try:
            await self._run("scontrol", "requeue", workload.id)
        except SchedulerError as exc:
            if exc.not_found:
                return
            log.warning("requeue of %s failed (%s); cancelling it", workload.id, exc)
            await self._run("scancel", "--signal=KILL", "--full", workload.id)


def _id(field: str) -> int:
    """A numeric uid or gid from squeue; -1 (nobody's) when it gave none: no process
    matches it, so the job's socket is never trusted and no directory is made for it."""
    return int(field) if field.isdigit() else -1


def _started_at(field: str) -> datetime | None:
    """`%S` under SLURM_TIME_FORMAT=%s; "N/A", "Unknown" or 0 (not started): None."""
    try:
        seconds = int(field)
    except ValueError:
        return None
    return datetime.fromtimestamp(seconds, UTC) if seconds > 0 else None
