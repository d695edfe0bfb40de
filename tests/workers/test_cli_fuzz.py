"""Every `sco` command, given what an operator should never get away with, refuses: exit 1
or 2, at most two lines on stderr, no traceback, within 10 s, and fleet state, Temporal and
the ledger as they were (tests/support/cli_fuzz.py says how the cases are made).

The region in a box: a region worker for r1 in its own process (as `sco dev up --workers`
runs it), namespaces r1-r3 on Temporal's dev server (r2 and r3 with no worker), a migrated
fleet-state database with r1's pools, NATS, a chDB ledger and a signed contract bundle.
The commands run in-process through typer's CliRunner: one process per case would cost
~1 s of imports each (the suite runs on 2 cores), and in-process they see the same
settings, through the environment, as a process would. Examples per command:
SCO_CLI_FUZZ_EXAMPLES (default 3, seed fixed); bench/cli_fuzz_bench.py runs more.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from contracts.region import Region
from tests.support import cli_fuzz, services
from tests.support.control_harness import install_example_bundle
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO
from tests.support.wait import eventually
from tests.support.worker_nats import NATS_URL
from workers.temporal_bootstrap import bootstrap_namespace, ensure_search_attributes

EXAMPLES = int(os.environ.get("SCO_CLI_FUZZ_EXAMPLES", "3"))
SEED = int(os.environ.get("SCO_CLI_FUZZ_SEED", "36"))
SUMMARY = Path(os.environ.get("SCO_CLI_FUZZ_SUMMARY", str(REPO / ".sco" / "cli-fuzz.json")))
COMMANDS = cli_fuzz.commands()
_ran: dict[str, int] = {}
#: What r1's worker starts when it comes up (services/region_worker/service.py).
STARTED_BY_WORKER = {*(f"controller-r1-p{p}" for p in range(4)), "reconciler-r1"}


@pytest.fixture(scope="module")
def cli_box(
    dev_server_env: WorkflowEnvironment,
    region_r1: Region,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, str]]:
    """The region in a box, r1's worker running; the settings that reach it."""
    tmp = tmp_path_factory.mktemp("cli-fuzz")
    address = dev_server_env.client.service_client.config.target_host
    prefix = f"fz{uuid.uuid4().hex[:6]}-"

    async def namespaces() -> None:
        base = await Client.connect(address, data_converter=pydantic_data_converter)
        for region in cli_fuzz.REGIONS:
            await bootstrap_namespace(base, f"{prefix}{region}", timedelta(days=1))
            ns = await Client.connect(address, namespace=f"{prefix}{region}")
            await ensure_search_attributes(ns, ns.namespace)

    asyncio.run(namespaces())
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    pool = open_pool(dsn, max_size=1)
    FleetRepository(pool).sync_pools(region_r1)
    pool.close()
    cache, trust = install_example_bundle(tmp / "contracts")
    health = services.free_port()
    env = {
        "SCO_TEMPORAL__ADDRESS": address,
        "SCO_TEMPORAL__NAMESPACE_PREFIX": prefix,
        "SCO_POSTGRES_DSN": dsn,
        "SCO_NATS_URL": NATS_URL,
        "SCO_PROVIDER__SIMULATOR_PREFIX": f"fz{uuid.uuid4().hex[:8]}",
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_DATA_DIR": str(tmp / "data"),
        "SCO_LEDGER_DSN": f"chdb://{tmp / 'ledger'}",
        "SCO_CONTRACTS__CACHE_DIR": str(cache),
        "SCO_CONTRACTS__TRUST_DIR": str(trust),
        "SCO_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{services.free_port()}",
        "SCO_WORKER__HEALTH_PORT": str(health),
        "SCO_WORKER__METRICS_PORT": "0",
        "SCO_WORKER__STATE_METRICS_PORT": "0",
        "SCO_WORKER__GRACEFUL_SHUTDOWN_SECONDS": "5",
        "SCO_CLI_FUZZ_SCRATCH": str(tmp / "scratch"),
    }
    (tmp / "scratch" / "cwd").mkdir(parents=True)
    (tmp / "scratch" / "a-file").write_text("a file, not a directory\n")
    log = (tmp / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "worker", "--region", cli_fuzz.BOX_REGION],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        eventually(
            lambda: _ready(health),
            timeout=90,
            what=f"r1's worker ready:\n{(tmp / 'worker.log').read_text()[-2000:]}",
            every=0.2,
        )
        # The worker starts the region's long-lived workflows once it is ready: the fuzz
        # begins when two snapshots a moment apart agree.
        last: list[cli_fuzz.State] = []

        def settled() -> bool:
            now = cli_fuzz.snapshot(env, *_dirs(env))
            running = {w[0] for ws in now.temporal.values() for w in ws if w[2] == "RUNNING"}
            same = bool(last) and not last[-1].diff(now) and running >= STARTED_BY_WORKER
            last.append(now)
            return same

        eventually(settled, timeout=90, what="the box settled", every=2.0)
        yield env
    finally:
        worker.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(30)
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        log.close()
        services.drop_database(dsn)
        # Only a worker that ran the fuzz writes: xdist may run this module's other tests
        # on another worker, whose fixture ran no case and would write zeros over it.
        if _ran:
            _write_summary()


def _write_summary() -> None:
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(
        json.dumps(
            {
                "commands": len(_ran),
                "cases": sum(_ran.values()),
                "seed": SEED,
                "examples_per_command": EXAMPLES,
                "per_command": _ran,
            },
            indent=2,
        )
    )


def _ready(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _dirs(env: dict[str, str]) -> tuple[Path, ...]:
    return (
        Path(env["SCO_LEDGER_DSN"].removeprefix("chdb://")),
        Path(env["SCO_CLI_FUZZ_SCRATCH"]),
        Path(env["SCO_CONTRACTS__CACHE_DIR"]),
    )


# -- the cases of issue 36, each by name ---------------------------------------------------


def sco(env: dict[str, str], *args: str) -> cli_fuzz.Outcome:
    """`sco ARGS` in-process against the box."""
    return cli_fuzz.run_case(list(args), env, Path(env["SCO_CLI_FUZZ_SCRATCH"]) / "cwd")


def refused(outcome: cli_fuzz.Outcome, *, code: int = 1) -> str:
    """The one error line of a refused command (and nothing on stdout)."""
    assert not outcome.problems(), outcome.describe()
    assert outcome.exit_code == code, outcome.describe()
    lines = [x for x in outcome.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), outcome.describe()
    assert outcome.stdout == "", outcome.describe()
    return lines[0].removeprefix("error: ")


def test_acquisitions_show_of_an_empty_id_is_one_line(cli_box: dict[str, str]) -> None:
    assert refused(sco(cli_box, "acquisitions", "show", "")) == "ACQUISITION_ID: empty"


def test_acquisitions_pause_by_nobody_is_one_line(cli_box: dict[str, str]) -> None:
    out = sco(cli_box, "acquisitions", "pause", "acq-r1-ci-runners-0123456789", "--by", "")
    assert refused(out) == "--by: empty"


def test_floor_status_of_an_empty_region_is_not_the_default_region(
    cli_box: dict[str, str],
) -> None:
    out = sco(cli_box, "floor", "status", "--region", "")
    assert refused(out) == "unknown region '' (known: r1, r2, r3)"


def test_pool_exclude_into_a_region_without_a_worker_neither_hangs_nor_starts_a_workflow(
    cli_box: dict[str, str],
) -> None:
    prefix = cli_box["SCO_TEMPORAL__NAMESPACE_PREFIX"]
    out = sco(cli_box, "pool", "exclude", "r2.A.gp.l", "--by", "op", "--reason", "test")
    assert out.seconds < cli_fuzz.MAX_SECONDS, out.describe()
    assert refused(out).startswith(
        f"no worker polls namespace {prefix}r2's task queue sco-r2: is the r2 worker running?"
    )

    async def started() -> list[str]:
        client = await Client.connect(cli_box["SCO_TEMPORAL__ADDRESS"], namespace=f"{prefix}r2")
        return [wf.id async for wf in client.list_workflows()]

    assert asyncio.run(started()) == []


def test_reclaim_of_a_deleted_instance_is_refused(
    cli_box: dict[str, str], region_r1: Region
) -> None:
    from activities.events import CapacityType, EventKind
    from activities.fleet.repository import InstanceSpec

    instance = f"acq-r1-gone-{uuid.uuid4().hex[:8]}-0"
    pool = open_pool(cli_box["SCO_POSTGRES_DSN"], max_size=1)
    try:
        repo = FleetRepository(pool)
        repo.record_acquire(
            InstanceSpec(
                instance_id=instance,
                region="r1",
                pool_id="r1.A.gp.l",
                capacity_type=CapacityType.RECLAIMABLE,
                workload="ci-runners",
                tier=3,
            )
        )
        repo.record_event(instance, EventKind.READY, provider_id="p-1")
        repo.record_event(instance, EventKind.DELETE)
    finally:
        pool.close()
    before = cli_fuzz.fleet_digest(cli_box["SCO_POSTGRES_DSN"])
    out = sco(cli_box, "reclaim", instance, "--region", "r1", "--by", "op")
    assert refused(out) == f"{instance}: already deleted; nothing to reclaim"
    assert cli_fuzz.fleet_digest(cli_box["SCO_POSTGRES_DSN"]) == before


def test_budget_set_rate_far_above_the_providers_limit_is_refused(
    cli_box: dict[str, str],
) -> None:
    before = cli_fuzz.snapshot(cli_box, *_dirs(cli_box))
    out = sco(cli_box, "budget", "set-rate", "0.05", "99999999999999999999", "--region", "r1")
    assert refused(out) == "burst 99999999999999999999: outside [1, 200]"
    out = sco(cli_box, "budget", "set-rate", "1e6", "20", "--region", "r1")
    assert refused(out) == "rate 1e+06: outside (0, 50]"
    out = sco(cli_box, "budget", "set-rate", "nan", "20", "--region", "r1")
    assert refused(out, code=2) == (
        "Invalid value for 'rate': Input should be greater than or equal to 0 "
        "(see `sco budget set-rate --help`)"
    )
    assert not before.diff(cli_fuzz.snapshot(cli_box, *_dirs(cli_box)))


def test_acquisitions_list_of_an_unknown_contract_is_an_error_not_an_empty_list(
    cli_box: dict[str, str],
) -> None:
    out = sco(cli_box, "acquisitions", "list", "--region", "r1", "--contract", "no-such-contract")
    assert refused(out).startswith("contract 'no-such-contract' is not in bundle serial ")


def test_demand_set_above_what_the_contract_allows_stores_nothing(
    cli_box: dict[str, str],
) -> None:
    before = sco(cli_box, "demand", "list", "--region", "r1", "--json")
    out = sco(cli_box, "demand", "set", "llm-train", "99999999999999999999", "--region", "r1")
    assert refused(out) == (
        "units 99999999999999999999: contract 'llm-train' allows 0 to 30 units per region "
        "in r1; nothing stored"
    )
    after = sco(cli_box, "demand", "list", "--region", "r1", "--json")
    assert before.exit_code == after.exit_code == 0 and before.stdout == after.stdout


def test_no_log_line_on_stdout(cli_box: dict[str, str]) -> None:
    """`sco` as its own process, stdout piped (logs would be JSON lines): stdout is the
    answer only; the bundle's INFO line shows on stderr under -v only."""
    argv = ["acquisitions", "list", "--region", "r1", "--contract", "llm-train", "--json"]
    for verbose in (False, True):
        done = subprocess.run(
            [sys.executable, "-m", "workers.cli", *(["-v"] if verbose else []), *argv],
            env={**os.environ, **cli_box},
            cwd=Path(cli_box["SCO_CLI_FUZZ_SCRATCH"]) / "cwd",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == []  # the whole of stdout is the answer
        assert ("contract bundle serial" in done.stderr) is verbose, done.stderr


def test_every_command_is_fuzzed() -> None:
    """The enumeration sees every command `sco --help` lists, and each of their commands."""
    from workers.cli.main import COMMANDS as TOP

    assert {c.path[0] for c in COMMANDS} == set(TOP)
    assert len(COMMANDS) >= 60


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", COMMANDS, ids=list(cli_fuzz.command_ids(COMMANDS)))
def test_a_command_refuses_what_it_should_never_get(
    command: cli_fuzz.Command, cli_box: dict[str, str]
) -> None:
    scratch = Path(cli_box["SCO_CLI_FUZZ_SCRATCH"])
    before = cli_fuzz.snapshot(cli_box, *_dirs(cli_box))
    outcomes: list[cli_fuzz.Outcome] = []

    @seed(SEED)
    @hsettings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def case(data: st.DataObject) -> None:
        args = data.draw(cli_fuzz.argv(command, scratch), label="argv")
        outcome = cli_fuzz.run_case(args, cli_box, scratch / "cwd")
        outcomes.append(outcome)
        assert not outcome.problems(), outcome.describe()

    start = time.monotonic()
    case()
    _ran[command.name] = len(outcomes)
    after = cli_fuzz.snapshot(cli_box, *_dirs(cli_box))
    changed = before.diff(after)
    assert not changed, (
        f"sco {command.name}: state changed by refused commands: {changed}\n"
        + "\n".join(" ".join(o.argv) for o in outcomes)
    )
    assert time.monotonic() - start < cli_fuzz.MAX_SECONDS * max(EXAMPLES, 1) * 2
