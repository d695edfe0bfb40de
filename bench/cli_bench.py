"""CLI benchmark: how fast `sco` answers, as absolute seconds and as ratios to
`python -c pass` in the same run (the ratio survives a slower or busier machine).

Commands run as operators run them, each its own process: `sco --help`, `sco --version`,
`import workers.cli.main`, `sco dev status --json`, and `sco demand set` end to end against
a Temporal dev server of its own and a scratch database on the machine's PostgreSQL (a
PostgreSQL write and a signal to the controller partition). Median of --runs. Prints JSON.

    .venv/bin/python bench/cli_bench.py [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.testing import WorkflowEnvironment

from activities.fleet.migrate import migrate
from tests.support import services
from tests.support.control_harness import install_example_bundle
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO
from workers.temporal_bootstrap import bootstrap_namespace

TARGETS = {"sco --help": 0.5, "sco demand set": 1.0, "sco dev status": 1.0}


def median_seconds(argv: list[str], env: dict[str, str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, cwd=REPO, capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def demand_env(tmp: Path) -> tuple[WorkflowEnvironment, dict[str, str], str]:
    server = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"), ui=False
    )
    await bootstrap_namespace(server.client, "bench-r1", timedelta(days=1))
    dsn = services.scratch_database(BASE_DSN)
    migrate(dsn)
    cache, trust = install_example_bundle(tmp / "contracts")
    env = {
        **os.environ,
        "SCO_TEMPORAL__ADDRESS": server.client.service_client.config.target_host,
        "SCO_TEMPORAL__NAMESPACE_PREFIX": "bench-",
        "SCO_POSTGRES_DSN": dsn,
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_DATA_DIR": str(tmp / "data"),
        "SCO_CONTRACTS__CACHE_DIR": str(cache),
        "SCO_CONTRACTS__TRUST_DIR": str(trust),
    }
    return server, env, dsn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    py = sys.executable
    sco = [py, "-m", "workers.cli"]
    env = dict(os.environ)
    seconds = {
        "python -c pass": median_seconds([py, "-c", "pass"], env, args.runs),
        "import workers.cli.main": median_seconds(
            [py, "-c", "import workers.cli.main"], env, args.runs
        ),
        "sco --help": median_seconds([*sco, "--help"], env, args.runs),
        "sco --version": median_seconds([*sco, "--version"], env, args.runs),
        "sco dev status": median_seconds([*sco, "dev", "status", "--json"], env, args.runs),
    }
    with tempfile.TemporaryDirectory() as tmp:
        server, denv, dsn = asyncio.run(demand_env(Path(tmp)))
        try:
            # Alternate the units so every call changes demand and signals the controller.
            times = []
            for i in range(args.runs):
                argv = [*sco, "demand", "set", "ci-runners", str(10 + i % 2), "--region", "r1"]
                start = time.perf_counter()
                subprocess.run(argv, env=denv, cwd=REPO, capture_output=True, check=True)
                times.append(time.perf_counter() - start)
            seconds["sco demand set"] = statistics.median(times)
        finally:
            asyncio.run(server.shutdown())
            services.drop_database(dsn)
    base = seconds["python -c pass"]
    print(
        json.dumps(
            {
                "runs": args.runs,
                "load_average_1m": os.getloadavg()[0],
                "seconds": {k: round(v, 3) for k, v in seconds.items()},
                "ratio_to_python": {k: round(v / base, 1) for k, v in seconds.items()},
                "targets_seconds": TARGETS,
                "met": {k: seconds[k] <= t for k, t in TARGETS.items()},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
