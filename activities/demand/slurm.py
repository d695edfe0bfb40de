"""Pending Slurm jobs as demand: `squeue --json` against the cluster's slurmctld, or the
same answer from slurmrestd.

Counts jobs that wait for resources now. Jobs held, waiting on a dependency or on their
begin time are not demand yet; jobs already allocated to powered-down CLOUD nodes are
CONFIGURING, not PENDING, and come to SCO through the ResumeProgram instead
(`slurm_resume`), so no job is counted twice.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import socket
import urllib.parse
from collections.abc import Mapping
from typing import Any

from activities.demand.model import PendingWork, Scheduler
from activities.demand.source import SourceUnavailable
from contracts.model import contract_tag_in_comment

#: state_reason values of jobs that could not start even with free capacity.
NOT_WAITING_FOR_CAPACITY = frozenset(
    {
        "JobHeldUser",
        "JobHeldAdmin",
        "Dependency",
        "DependencyNeverSatisfied",
        "BeginTime",
        "AssocGrpJobsLimit",
        "AccountNotAllowed",
        "InvalidAccount",
        "InvalidQOS",
        "PartitionDown",
        "PartitionInactive",
    }
)

_MEM_UNIT_GIB = {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0, "P": 1024.0**2}


class SlurmPendingJobs:
    name = "slurm"

    def __init__(
        self,
        *,
        squeue: str = "squeue",
        env: Mapping[str, str] | None = None,
        partitions: list[str] | None = None,
        timeout: float = 20.0,
    ) -> None:
        self._squeue = squeue
        self._env = dict(env) if env is not None else None
        self._partitions = partitions or []
        self._timeout = timeout

    async def pending(self) -> list[PendingWork]:
        args = [self._squeue, "--json", "--states=PENDING"]
        if self._partitions:
            args.append(f"--partition={','.join(self._partitions)}")
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **self._env} if self._env is not None else None,
            )
        except OSError as exc:
            raise SourceUnavailable(self.name, f"cannot run {self._squeue}: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self._timeout)
        except TimeoutError as exc:
            proc.kill()
            await proc.wait()
            why = f"squeue gave no answer in {self._timeout} s"
            raise SourceUnavailable(self.name, why) from exc
        if proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            raise SourceUnavailable(
                self.name, f"squeue exited {proc.returncode}: {lines[-1] if lines else ''}"
            )
        return parse_squeue_json(out)


def parse_squeue_json(raw: bytes | str) -> list[PendingWork]:
    """The pending jobs of one `squeue --json` answer (Slurm 22.05 and later)."""
    try:
        doc = json.loads(raw)
        jobs = doc["jobs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceUnavailable("slurm", f"squeue --json answer is not a job list: {exc}") from exc
    out: list[PendingWork] = []
    for job in jobs:
        work = _pending_work(job)
        if work is not None:
            out.append(work)
    return out


def _pending_work(job: dict[str, Any]) -> PendingWork | None:
    state = job.get("job_state")
    if isinstance(state, list):  # Slurm 23.11+: a list of flags
        state = state[0] if state else ""
    if state != "PENDING" or job.get("state_reason") in NOT_WAITING_FOR_CAPACITY:
        return None
    tres = parse_tres(job.get("tres_req_str") or "")
    cpus = tres.get("cpu") or float(_number(job.get("cpus")) or 1)
    memory = tres.get("mem", 0.0)
    gpus = int(tres.get("gres/gpu", 0))
    return PendingWork(
        scheduler=Scheduler.SLURM,
        ref=str(job.get("job_id")),
        contract=contract_tag_in_comment(job.get("comment")),
        account=job.get("account") or "",
        partition=job.get("partition") or "",
        vcpu=cpus,
        memory_gib=memory,
        gpus=gpus,
        count=array_task_count(job.get("array_task_string") or ""),
    )


def _number(value: Any) -> float | None:
    """squeue's numbers: plain, or (23.02+) {"set": true, "number": n}."""
    if isinstance(value, dict):
        return float(value["number"]) if value.get("set") else None
    return float(value) if isinstance(value, int | float) else None


def parse_tres(text: str) -> dict[str, float]:
    """`cpu=4,mem=16G,node=1,gres/gpu=2` -> cpu 4, mem in GiB 16, gres/gpu 2."""
    out: dict[str, float] = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key == "mem":
            match = re.fullmatch(r"([0-9.]+)([KMGTP]?)", value)
            if match:
                out[key] = float(match[1]) * _MEM_UNIT_GIB[match[2] or "M"]
            continue
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def array_task_count(spec: str) -> int:
    """Pending tasks of an array job from its task string (`1-100:2%10,200`); 1 if none."""
    spec = spec.split("%", 1)[0]
    total = 0
    for part in filter(None, spec.split(",")):
        rng, _, step = part.partition(":")
        lo, _, hi = rng.partition("-")
        try:
            if hi:
                total += (int(hi) - int(lo)) // int(step or 1) + 1
            else:
                int(lo)
                total += 1
        except ValueError:
            return max(total, 1)
    return max(total, 1)


class SlurmRestPendingJobs:
    """The same pending jobs from slurmrestd (`GET /slurm/<api>/jobs`), for control planes
    that run without Slurm's client tools and munge: a container, another host.

    `url` is `http://host:6820` (JWT: `user` and `token` go in X-SLURM-USER-NAME and
    X-SLURM-USER-TOKEN) or `unix:/path/to/slurmrestd.sock` (rest_auth/local: the socket's
    peer credentials). The answer has squeue --json's shape (both are Slurm's OpenAPI
    plugin), so one parser reads both.
    """

    name = "slurm"

    def __init__(
        self,
        url: str,
        *,
        user: str = "",
        token: str = "",
        api_version: str = "v0.0.38",
        partitions: list[str] | None = None,
        timeout: float = 20.0,
    ) -> None:
        self._url = url
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers |= {"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token}
        self._path = f"/slurm/{api_version}/jobs"
        self._partitions = set(partitions or [])
        self._timeout = timeout

    async def pending(self) -> list[PendingWork]:
        status, body = await asyncio.to_thread(self._get)
        if status != 200:
            text = body.decode(errors="replace").strip().replace("\n", " ")
            raise SourceUnavailable(self.name, f"slurmrestd answered {status}: {text[:200]}")
        works = parse_squeue_json(body)
        if self._partitions:
            works = [w for w in works if w.partition in self._partitions]
        return works

    def _get(self) -> tuple[int, bytes]:
        conn = _connection(self._url, self._timeout)
        try:
            conn.request("GET", self._path, headers=self._headers)
            response = conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise SourceUnavailable(self.name, f"slurmrestd at {self._url}: {exc}") from exc
        finally:
            conn.close()


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._socket_path)
        self.sock = sock


def _connection(url: str, timeout: float) -> http.client.HTTPConnection:
    if url.startswith("unix:"):
        return _UnixConnection(url.removeprefix("unix:"), timeout)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        why = f"slurm.rest_url {url!r}: expected http(s)://host:port or unix:/path"
        raise SourceUnavailable("slurm", why)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname, parts.port, timeout=timeout)
