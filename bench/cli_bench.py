"""CLI benchmark: how fast `sco` answers, as absolute seconds and as ratios to
`python -c pass` in the same run (the ratio survives a slower or busier machine).

Commands run as operators run them, each its own process: `sco --help`, `sco --version`,
`import workers.cli.main`, `sco dev status --json`, and `sco demand set` end to end against
a Temporal dev server of its own and a scratch database on the machine's PostgreSQL (a
PostgreSQL write and a signal to the controller partition). Median of --runs. Prints one
JSON report (bench/report.py); a command that fails is a measurement that did not happen.

    .venv/bin/python bench/cli_bench.py [--runs 5] [--tiny]
"""

from __future__ import annotations

import argparse
import asyncio
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
from bench.report import Report
from tests.support import services
from tests.support.control_harness import install_example_bundle
from tests.support.paths import BASE_DSN, REGIONS_DIR, REPO
from workers.devbox import process
from workers.devbox.services import KafkaService
from workers.settings import Settings
from workers.temporal_bootstrap import bootstrap_namespace

TARGETS = {"sco --help": 0.5, "sco demand set": 1.0, "sco dev status": 1.0}


class CommandFailed(Exception):
    pass


def median_seconds(
    argv: list[str], env: dict[str, str], runs: int, ok: tuple[int, ...] = (0,)
) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, timeout=120)
        times.append(time.perf_counter() - start)
        if done.returncode not in ok:
            tail = (done.stderr or done.stdout).decode().strip().splitlines()[-1:]
            raise CommandFailed(f"exit {done.returncode}: {' '.join(tail)[:200]}")
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
        "SCO_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{services.free_port()}",
    }
    return server, env, dsn


def measure(
    report: Report,
    name: str,
    argv: list[str],
    env: dict[str, str],
    runs: int,
    base: float,
    ok: tuple[int, ...] = (0,),
) -> None:
    anchor = f"median of {runs} runs; python -c pass = {base:.3f} s in the same run"
    try:
        seconds = median_seconds(argv, env, runs, ok)
    except (CommandFailed, subprocess.TimeoutExpired) as exc:
        report.measurement_missing(name, str(exc), "s", anchor=anchor)
        return
    target = TARGETS.get(name)
    report.figure(
        name,
        round(seconds, 3),
        "s",
        anchor=anchor,
        target=target,
        comparator="<=" if target is not None else None,
    )
    report.figure(f"{name} / python -c pass", round(seconds / base, 1), "x", anchor=anchor)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="one run of each command")
    args = parser.parse_args()
    runs = 1 if args.tiny else args.runs
    report = Report("cli", {"runs": runs})
    py = sys.executable
    sco = [py, "-m", "workers.cli"]
    env = dict(os.environ)
    base = median_seconds([py, "-c", "pass"], env, runs)
    report.figure("python -c pass", round(base, 3), "s", anchor="the interpreter's start")
    for name, argv in (
        ("import workers.cli.main", [py, "-c", "import workers.cli.main"]),
        ("sco --help", [*sco, "--help"]),
        ("sco --version", [*sco, "--version"]),
    ):
        measure(report, name, argv, env, runs, base)
    with tempfile.TemporaryDirectory() as tmp:
        server, denv, dsn = asyncio.run(demand_env(Path(tmp)))
        kafka = KafkaService(
            Settings(
                data_dir=Path(tmp) / "kafka",
                kafka={"bootstrap_servers": denv["SCO_KAFKA__BOOTSTRAP_SERVERS"]},
            )
        )
        broker = kafka.start()
        try:
            # Every service of the box answers (the ledger is not made yet: exit 1 by design).
            status = [*sco, "dev", "status", "--json"]
            measure(report, "sco dev status", status, denv, runs, base, ok=(0, 1))
            # Alternate the units so every call changes demand and signals the controller;
            # a first call warms the namespace and the controller partition.
            calls = [
                [*sco, "demand", "set", "ci-runners", str(10 + i % 2), "--region", "r1"]
                for i in range(runs + 1)
            ]
            median_seconds(calls[0], denv, 1)
            times = [median_seconds(argv, denv, 1) for argv in calls[1:]]
            anchor = f"median of {runs} runs; python -c pass = {base:.3f} s in the same run"
            demand = statistics.median(times)
            report.figure(
                "sco demand set", round(demand, 3), "s", anchor=anchor, target=1.0, comparator="<="
            )
            report.figure(
                "sco demand set / python -c pass", round(demand / base, 1), "x", anchor=anchor
            )
        except CommandFailed as exc:
            report.measurement_missing("sco demand set", str(exc), "s", anchor="first call")
        finally:
            process.stop(broker)
            asyncio.run(server.shutdown())
            services.drop_database(dsn)
    raise SystemExit(report.emit())


if __name__ == "__main__":
    main()
