"""Session fixtures: one per real service, each started once and stopped at the end."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

# numpy's submodules load lazily (numpy.__getattr__), and a lazy load racing another
# thread's (a Temporal activity thread planning exactly, left from an earlier test of the
# same xdist worker) left numpy half-initialised: RecursionError in numpy.__getattr__ for
# `linalg`, then "AST constructor recursion depth mismatch" in every later test of that
# worker. Loaded here, in the main thread, before any test starts a thread. The product
# imports them under one lock (activities/control/exact_plan.scientific).
import numpy.linalg  # noqa: F401  (for the side effect above)
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.fleet.repository import FleetRepository
from contracts.region import Region, load_region
from tests.support import fleet_db, parallel, services, tools
from tests.support.paths import REGIONS_DIR
from workers.devbox import process
from workers.devbox.services import KafkaService
from workers.settings import Settings
from workers.temporal_bootstrap import bootstrap_namespace, ensure_search_attributes

# The Debian 12 node image and agent .deb (built once for the tests that start nodes), the
# Ceph RGW session fixture `rgw` (started only by the tests that ask for it), and the
# report of where the time went (session fixtures' set-up, at the end of every run).
pytest_plugins = [
    "tests.support.deb_node",
    "tests.support.prep",
    "tests.support.rgw",
    "tests.support.timing",
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "tools(*names): needs these tools of tests/support/tools.py (make deps)"
    )
    config.addinivalue_line(
        "markers", "chaos_slow: a chaos case of minutes, left out of `make test` (`make chaos`)"
    )
    config.addinivalue_line(
        "markers", "slow: starts a real cluster of JVMs or the like (a minute or more)"
    )
    config.addinivalue_line(
        "markers", "services: needs a running service; set by tests/support/parallel.py"
    )


# tryfirst: the xdist groups must be set before pytest-xdist's worker reads them in its
# own collection_modifyitems (it appends "@group" to each nodeid for --dist loadgroup). This
# conftest is registered before that plugin, so without tryfirst it ran after it, and every
# group set here was ignored: the test-cloud modules ran on several workers at once and each
# one's clean-up deleted the servers and leases another's floor keeper was using.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`@pytest.mark.tools("slurmctld", ...)`: the test skips unless those tools are here
    (a skip mark, so the skip is reported at the test). And the xdist groups
    (tests/support/parallel.py): which tests must share one worker."""
    parallel.group(items)
    parallel.mark_services(items)
    if tools.REQUIRED:
        return  # pytest_runtest_setup fails them instead
    for item in items:
        for mark in item.iter_markers("tools"):
            if gone := tools.missing(mark.args):
                item.add_marker(pytest.mark.skip(reason=tools.skip_reason(gone)))


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("tools"):
        tools.require(*mark.args)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Once per session: which tools were missing, what skipped for them, how to install."""
    skips = []
    for report in terminalreporter.stats.get("skipped", []):
        if isinstance(report.longrepr, tuple):
            skips.append((report.nodeid.split("::")[0], str(report.longrepr[2])))
    if lines := tools.summary(skips):
        terminalreporter.write_sep("=", "missing tools")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory with a short path, for Unix sockets in it: a socket's path is
    at most 107 bytes, and under xdist tmp_path is 11 longer (`popen-gwN/`)."""
    path = Path(tempfile.mkdtemp(prefix="sco-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def region_r1() -> Region:
    return load_region(REGIONS_DIR / "r1.toml")


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """A migrated scratch database on the machine's PostgreSQL."""
    with fleet_db.migrated_scratch_database() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def fleet_repo(pg_dsn: str, region_r1: Region) -> Iterator[FleetRepository]:
    with fleet_db.fleet_repository(pg_dsn, region_r1, max_size=8) as repo:
        yield repo


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[process.ProcessRecord]:
    """A real Kafka-protocol broker (tansu) on a free port, with the lifecycle topics."""
    port = services.free_port()
    s = Settings(
        data_dir=tmp_path_factory.mktemp("kafka"),
        kafka={"bootstrap_servers": f"127.0.0.1:{port}", "partitions": 4},
    )
    svc = KafkaService(s)
    record = svc.start()
    svc.prepare()
    yield record
    process.stop(record)


@pytest.fixture(scope="session")
def kafka_bootstrap(tansu: process.ProcessRecord) -> str:
    url = tansu.argv[tansu.argv.index("--listener-url") + 1]
    return url.removeprefix("tcp://")


@pytest.fixture(scope="session")
async def dev_server_env() -> AsyncIterator[WorkflowEnvironment]:
    """Temporal's dev server: the real server's semantics where the time-skipping test
    server differs (it ignores an activity error's next_retry_delay, for one)."""
    import sys

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        data_converter=pydantic_data_converter,
        ui=False,
        # The default 5 s is not enough on a loaded machine (2 cores, many test sessions).
        dev_server_startup_timeout=timedelta(seconds=60),
    )
    await ensure_search_attributes(env.client, env.client.namespace)
    yield env
    await env.shutdown()


@pytest.fixture
async def region_client(dev_server_env: WorkflowEnvironment) -> AsyncIterator[Client]:
    """A client of a fresh `<prefix>r1` namespace on the dev server: region r1 under
    `temporal.namespace_prefix` (see `namespace_prefix`), its fixed workflow ids (controller
    partitions, budgets) apart from every other test's."""
    prefix = f"t{uuid.uuid4().hex[:8]}-"
    base = dev_server_env.client
    await bootstrap_namespace(base, f"{prefix}r1", timedelta(days=1))
    client = await Client.connect(
        base.service_client.config.target_host,
        namespace=f"{prefix}r1",
        data_converter=pydantic_data_converter,
    )
    await ensure_search_attributes(client, client.namespace)
    yield client


@pytest.fixture
async def workflow_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of the test's own (~0.15 s to start). Not one per session:
    there every earlier test's leftover workflows and timers fire whenever a later test
    skips time, which on a loaded CI machine made timer-heavy tests outlast their timeouts
    and left the server too busy to answer the next ones (RPC "Timeout expired")."""
    env = await services.start_workflow_env()
    yield env
    await env.shutdown()
