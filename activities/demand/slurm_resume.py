"""Slurm power saving: which instances a ResumeProgram call asks for, and for whom.

Reclaimable nodes are Slurm CLOUD nodes whose features name their pool, hall and capacity
type (`sco,pool_r1.A.gp.m,hall_A,sku_gp,size_m,reclaimable`). When a job is allocated
powered-down nodes, slurmctld runs our ResumeProgram with their hostlist (and, from Slurm
22.05, `SLURM_RESUME_FILE`: which job wants which nodes). This module turns that into one
acquisition per contract with the node names as hostnames; the reads of `scontrol` and
`squeue` are in `SlurmCommands`, everything else is pure.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from activities.demand.hostlist import HostlistError, expand
from contracts.feasibility import units_per_instance
from contracts.matching import SlurmIdentity, match_contract
from contracts.model import Contract, contract_tag_in_comment
from contracts.region import Region

#: Node features SCO writes into the slurm.conf fragment (`sco slurm conf`).
SCO_FEATURE = "sco"
POOL_FEATURE = "pool_"
HALL_FEATURE = "hall_"
SKU_FEATURE = "sku_"
SIZE_FEATURE = "size_"
CAPACITY_FEATURES = ("reclaimable", "committed")


class SlurmError(RuntimeError):
    """Slurm could not be asked (scontrol/squeue failed); the message says which."""


class SlurmNode(BaseModel):
    name: str
    features: list[str] = []
    state: str = ""

    @property
    def pool_id(self) -> str | None:
        for f in self.features:
            if f.startswith(POOL_FEATURE):
                return f[len(POOL_FEATURE) :]
        return None


class SlurmJob(BaseModel):
    job_id: int
    account: str = ""
    partition: str = ""
    comment: str = ""
    nodes: list[str] = []


class NodeGroup(BaseModel):
    """Nodes of one pool that one contract's jobs wait for: one launch item."""

    contract: str
    tier: int
    pool_id: str
    hall: str
    flavor: str
    nodes: list[str]
    units: int
    jobs: list[int] = []


class ResumePlan(BaseModel):
    groups: list[NodeGroup] = []
    refused: dict[str, str] = {}  # node -> why SCO will not bring it up


def feature_list(pool_id: str, hall: str, sku: str, size: str, capacity_type: str) -> list[str]:
    """The features of a node of this pool, in the order the fragment writes them."""
    return [
        SCO_FEATURE,
        f"{POOL_FEATURE}{pool_id}",
        f"{HALL_FEATURE}{hall}",
        f"{SKU_FEATURE}{sku}",
        f"{SIZE_FEATURE}{size}",
        capacity_type,
    ]


def parse_show_node(text: str) -> dict[str, SlurmNode]:
    """`scontrol show node -o`: one `Key=Value ...` line per node."""
    nodes: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        fields = {k: v for k, _, v in (kv.partition("=") for kv in line.split())}
        name = fields.get("NodeName")
        if not name:
            continue
        features = fields.get("AvailableFeatures") or fields.get("Features") or ""
        nodes[name] = SlurmNode(
            name=name,
            features=[f for f in features.split(",") if f and f != "(null)"],
            state=fields.get("State", ""),
        )
    return nodes


def parse_resume_file(text: str) -> dict[str, int]:
    """node -> job id from `SLURM_RESUME_FILE` (22.05: `nodes`; 23.02+: `nodes_resume`)."""
    try:
        doc = json.loads(text)
        jobs = doc.get("jobs") or []
    except (ValueError, AttributeError) as exc:
        raise SlurmError(f"SLURM_RESUME_FILE is not JSON: {exc}") from exc
    out: dict[str, int] = {}
    for job in jobs:
        hosts = job.get("nodes_resume") or job.get("nodes_alloc") or job.get("nodes") or ""
        for node in expand(hosts):
            out.setdefault(node, int(job["job_id"]))
    return out


def parse_jobs(raw: bytes | str) -> dict[int, SlurmJob]:
    """`squeue --json` answer -> jobs by id, with their node lists expanded."""
    try:
        jobs = json.loads(raw)["jobs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SlurmError(f"squeue --json answer is not a job list: {exc}") from exc
    out: dict[int, SlurmJob] = {}
    for job in jobs:
        try:
            nodes = expand(job.get("nodes") or "")
        except HostlistError:
            nodes = []
        out[int(job["job_id"])] = SlurmJob(
            job_id=int(job["job_id"]),
            account=job.get("account") or "",
            partition=job.get("partition") or "",
            comment=job.get("comment") or "",
            nodes=nodes,
        )
    return out


def plan_resume(
    nodes: Sequence[str],
    node_info: Mapping[str, SlurmNode],
    node_jobs: Mapping[str, SlurmJob],
    contracts: Sequence[Contract],
    region: Region,
) -> ResumePlan:
    """Group the nodes to resume by (contract, pool); every other node says why not."""
    plan = ResumePlan()
    pools = {region.pool_id(p): p for p in region.pools}
    here = [c for c in contracts if region.id in c.regions]
    groups: dict[tuple[str, str], NodeGroup] = {}
    for node in nodes:
        info = node_info.get(node)
        pool_id = info.pool_id if info else None
        if info is None:
            plan.refused[node] = "slurmctld does not know this node"
            continue
        if pool_id is None:
            plan.refused[node] = f"node has no {POOL_FEATURE}<pool id> feature"
            continue
        pool = pools.get(pool_id)
        if pool is None:
            plan.refused[node] = f"pool {pool_id} is not a pool of region {region.id}"
            continue
        job = node_jobs.get(node)
        if job is None:
            plan.refused[node] = "no job is waiting for this node (powered up by hand?)"
            continue
        found = match_contract(
            here, SlurmIdentity(contract_tag_in_comment(job.comment), job.account, job.partition)
        )
        if isinstance(found, str):
            plan.refused[node] = f"job {job.job_id}: {found}"
            continue
        per = units_per_instance(found.unit, pool)
        group = groups.setdefault(
            (found.name, pool_id),
            NodeGroup(
                contract=found.name,
                tier=found.tier,
                pool_id=pool_id,
                hall=pool.hall,
                flavor=pool.flavor,
                nodes=[],
                units=0,
            ),
        )
        group.nodes.append(node)
        group.units += per
        if job.job_id not in group.jobs:
            group.jobs.append(job.job_id)
    plan.groups = [groups[k] for k in sorted(groups)]
    return plan


class SlurmCommands:
    """scontrol and squeue against the cluster of `slurm_conf` (None: Slurm's default)."""

    def __init__(
        self, *, bin_dir: str | None = None, slurm_conf: str | None = None, timeout: float = 20
    ) -> None:
        self._bin = bin_dir
        self._env = {**os.environ, **({"SLURM_CONF": slurm_conf} if slurm_conf else {})}
        self._timeout = timeout

    async def run(self, tool: str, *args: str) -> str:
        exe = os.path.join(self._bin, tool) if self._bin else tool
        try:
            proc = await asyncio.create_subprocess_exec(
                exe,
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
            )
            out, err = await asyncio.wait_for(proc.communicate(), self._timeout)
        except (OSError, TimeoutError) as exc:
            raise SlurmError(f"{tool} {' '.join(args)}: {exc or 'timed out'}") from exc
        if proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            raise SlurmError(
                f"{tool} {' '.join(args)} exited {proc.returncode}: {lines[-1] if lines else ''}"
            )
        return out.decode(errors="replace")

    async def nodes(self) -> dict[str, SlurmNode]:
        return parse_show_node(await self.run("scontrol", "show", "node", "-o"))

    async def jobs(self, job_ids: Sequence[int] = ()) -> dict[int, SlurmJob]:
        args = ["--json"]
        if job_ids:
            args.append(f"--jobs={','.join(str(j) for j in sorted(set(job_ids)))}")
        return parse_jobs(await self.run("squeue", *args))

    async def node_jobs(self, nodes: Sequence[str], resume_file: str | None) -> dict[str, SlurmJob]:
        """The job each node is resumed for: from the resume file's text where Slurm gives
        one (`SLURM_RESUME_FILE`), else from the jobs squeue shows on the nodes."""
        by_node = parse_resume_file(resume_file) if resume_file else {}
        jobs = await self.jobs(sorted(set(by_node.values())) if by_node else ())
        if not by_node:
            for job in jobs.values():
                for node in job.nodes:
                    by_node.setdefault(node, job.job_id)
        return {n: jobs[by_node[n]] for n in nodes if n in by_node and by_node[n] in jobs}


def render_user_data(template: str, **fields: Any) -> str:
    """The user-data template with `{slurmctld}`-style fields filled; `{hostname}` is kept
    for the acquisition to fill per instance."""
    return template.replace("{hostname}", "\0").format(**fields).replace("\0", "{hostname}")
