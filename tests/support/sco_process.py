"""`sco` processes in their own OS process for tests (the long-running services as an
operator runs them), a migrated database of their own, and the environment that points
them at the real services. The fixtures are re-exported by tests/workers/conftest.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.fleet.db import open_pool
from activities.fleet.migrate import migrate
from activities.fleet.repository import FleetRepository
from contracts import keys
from contracts.region import Region
from tests.support import services
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO
from tests.support.wait import WaitTimeout, eventually
from tests.support.worker_nats import NATS_URL

# Well inside the per-test timeout: a stop that takes longer than this is a hang.
STOP_SECONDS = 15.0


@pytest.fixture
def process_db(region_r1: Region) -> Iterator[str]:
    """A migrated scratch database of its own: the outbox relay's leader lock and the
    relay's notices touch no other test's rows."""
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    pool = open_pool(dsn, max_size=1)
    FleetRepository(pool).sync_pools(region_r1)
    pool.close()
    yield dsn
    services.drop_database(dsn)


@pytest.fixture
def env(process_db: str, tmp_path: Path) -> dict[str, str]:
    """Settings of the box's processes, by environment; the relays sign with a key of their own."""
    _, secret, _ = keys.generate(tmp_path / "notice-keys")
    return {
        **os.environ,
        "SCO_NOTICES__SIGNING_KEY_FILE": str(secret),
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_DATA_DIR": str(tmp_path / "data"),
        "SCO_POSTGRES_DSN": process_db,
        "SCO_NATS_URL": NATS_URL,
        "SCO_PROVIDER__SIMULATOR_PREFIX": f"ps{uuid.uuid4().hex[:8]}",
        "SCO_LEDGER_DSN": f"chdb://{tmp_path / 'ledger'}",
    }


class Process:
    """`sco ARGS` in its own process, its output (logs included) in a file."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", *args],
            cwd=REPO,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 30.0) -> None:

        def logged() -> bool:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.output()}"
            return text in self.output()

        try:
            eventually(logged, timeout=timeout, what=f"{text!r} in the log", retrying=())
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}:\n{self.output()}") from exc

    def stop(self, sig: signal.Signals) -> int:
        """Send `sig`; the exit status, or a failure if it does not stop in time."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {STOP_SECONDS} s after {sig.name}:\n{self.output()}")
        finally:
            self._out.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._out.close()


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    """Processes a test started; whatever a failed test left running is killed."""
    started: list[Process] = []
    yield started
    for p in started:
        p.kill()
