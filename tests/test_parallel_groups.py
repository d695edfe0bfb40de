"""The xdist groups hold: tests of one `xdist_group` run on one worker under `make test`'s
`--dist loadgroup` (tests/support/parallel.py). With pytest 9.2 and pytest-xdist 3.8 they
silently did not, nor when the suite's hook set the groups after xdist had read them: the
test cloud's modules ran on several workers at once and each one's clean-up deleted the
servers and leases of another's acquisition."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import services
from tests.support.paths import REPO

pytestmark = pytest.mark.timeout(120)

# A module with a module-scoped fixture: tests/support/parallel.py groups it (no mark of
# its own), through the suite's own collection hook, as it groups the test cloud's modules.
GROUPED = """
import os, json, pathlib, pytest

@pytest.fixture(scope="module")
def shared():
    return os.environ["PYTEST_XDIST_WORKER"]

@pytest.mark.parametrize("i", range(8))
def test_grouped(i, shared):
    out = pathlib.Path(os.environ["GROUPS_OUT"]) / f"{i}.json"
    out.write_text(json.dumps(os.environ["PYTEST_XDIST_WORKER"]))

@pytest.mark.parametrize("i", range(8))
def test_free(i):
    pass
"""
CONFTEST = "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"


def test_one_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
            *("-n", "2", "--dist", "loadgroup", str(tmp_path / "test_grouped.py")),
            # Not /tmp/pytest-of-<user>: a new pytest resets it to 0700 while the suite's
            # services that run as other users (postgres) need to pass through it.
            *("--basetemp", str(tmp_path / "basetemp")),
        ],
        cwd=tmp_path,
        env={**os.environ, "GROUPS_OUT": str(out), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    workers = {json.loads(p.read_text()) for p in out.glob("*.json")}
    assert len(list(out.glob("*.json"))) == 8
    assert len(workers) == 1, f"one xdist_group ran on {sorted(workers)}"


def test_each_xdist_worker_draws_port_runs_from_a_share_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two workers' boxes once picked overlapping runs: one bound the other's Prometheus
    # port between its check and its bind.
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    shares = []
    for i in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{i}")
        shares.append(services.worker_ranges())
        first = services.free_port_range(8)
        assert shares[-1][0] <= first and first + 8 <= shares[-1][1]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(shares))
    assert shares[0][0] == services.RANGES_FROM and shares[-1][1] <= services.RANGES_TO
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert services.worker_ranges() == (services.RANGES_FROM, services.RANGES_TO)


def test_a_run_handed_out_is_not_handed_out_again_before_it_is_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A box's OpenBao run (2 ports) and its processes' run (32), picked one after the
    other and bound later: CI once had them overlap. In a share of 200 ports the picks
    would meet by chance within a few tries; handed out, they never do."""
    monkeypatch.setattr(services, "worker_ranges", lambda: (28000, 28200))
    monkeypatch.setattr(services, "_HANDED_OUT", type(services._HANDED_OUT)(maxlen=64))
    for _ in range(20):
        services._HANDED_OUT.clear()
        a, b = services.free_port_range(2), services.free_port_range(32)
        assert not (a < b + 32 and b < a + 2), (a, b)


PROBE = """
from tests.support import parallel

def pytest_collection_finish(session):
    for item in session.items:
        print("GROUP", item.nodeid, parallel.group_of(item))
"""


def test_rgws_tests_share_podmans_worker_so_ci_starts_rgw_once(tmp_path: Path) -> None:
    (tmp_path / "groups_probe.py").write_text(PROBE)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"),
            *("-n0", "-p", "groups_probe", "tests/agent/test_agent_dcp_rgw.py"),
            "tests/workers/test_cli_checkpoints.py",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    groups = dict(
        line.split()[1:] for line in done.stdout.splitlines() if line.startswith("GROUP ")
    )
    with_rgw = [g for nodeid, g in groups.items() if "without_provisioned" not in nodeid]
    assert len(with_rgw) == 3 and set(with_rgw) == {"podman"}, groups
    # A test that needs no RGW is free to run anywhere.
    assert "None" in groups.values()
