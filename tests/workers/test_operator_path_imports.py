"""The operator's path, `sco demand set` then `sco acquisitions list`, imports only what
it uses: both are a Python process each, and their start-up is most of the path's time
(bench/operator_path_bench.py). Each command runs against the real services to its end;
the modules its process then holds are compared with what it must not load: rich (a
`--json` answer prints none of it), the planner and its models (the acquisition's messages
live apart from its input: workflows/acquisition/messages.py), scipy/numpy, and for the
list the fleet-state client (it reads Temporal only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.fleet.migrate import migrate
from tests.support import services
from tests.support.control_harness import install_example_bundle
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO

MARK = "modules-at-exit:"

#: What `sco <command> --json` runs as, printing the modules it holds when it exits (the
#: CLI leaves through os._exit: no atexit hook runs).
_PROBE = (
    "import json, os, sys\n"
    "_exit = os._exit\n"
    "def _report(code):\n"
    f"    print({MARK!r} + json.dumps(sorted(sys.modules)), file=sys.stderr, flush=True)\n"
    "    _exit(code)\n"
    "os._exit = _report\n"
    "sys.argv = ['sco', *sys.argv[1:]]\n"
    "from workers.cli.main import main\n"
    "main()\n"
)

NEVER = ("rich", "planning", "scipy", "numpy", "openstack", "aiohttp")


def _held(env: dict[str, str], *args: str) -> tuple[int, str, set[str]]:
    """Exit code, stdout and the modules `sco ARGS` held at its exit."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [x for x in done.stderr.splitlines() if x.startswith(MARK)]
    assert lines, f"no module list (exit {done.returncode}): {done.stderr[-2000:]}"
    return done.returncode, done.stdout, set(json.loads(lines[-1][len(MARK) :]))


def _under(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in packages)


@pytest.mark.timeout(240)
async def test_demand_set_then_acquisitions_list_load_only_what_they_use(
    region_client: Client, tmp_path: Path
) -> None:
    dsn = services.scratch_database(BASE_DSN)
    try:
        migrate(dsn)
        cache, trust = install_example_bundle(tmp_path / "bundle")
        env = {
            **os.environ,
            "SCO_TEMPORAL__ADDRESS": region_client.service_client.config.target_host,
            "SCO_TEMPORAL__NAMESPACE_PREFIX": services.namespace_prefix(region_client),
            "SCO_REGIONS_DIR": str(REGIONS_DIR),
            "SCO_DATA_DIR": str(tmp_path / "data"),
            "SCO_POSTGRES_DSN": dsn,
            "SCO_CONTRACTS__CACHE_DIR": str(cache),
            "SCO_CONTRACTS__TRUST_DIR": str(trust),
        }
        units = str(10 + uuid.uuid4().int % 50)
        code, out, held = _held(
            env, "demand", "set", "ci-runners", units, "--region", "r1", "--json"
        )
        assert code == 0, out
        assert json.loads(out)["units"] == int(units)
        assert "psycopg" in held and "temporalio.client" in held  # the probe saw it work
        assert _under(held, NEVER) == [], "sco demand set loads them"

        code, out, held = _held(
            env, "acquisitions", "list", "--json", "--contract", "ci-runners", "--region", "r1"
        )
        assert code == 0, out
        assert isinstance(json.loads(out), list)
        assert "temporalio.client" in held
        assert _under(held, (*NEVER, "psycopg", "psycopg_pool", "prometheus_client")) == [], (
            "sco acquisitions list loads them"
        )
    finally:
        services.drop_database(dsn)
