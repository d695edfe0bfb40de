"""CLI fuzz, the long run: tests/workers/test_cli_fuzz.py with more examples per command
and a seed of its own, on the region in a box the test builds (a region worker for r1,
namespaces r1-r3, fleet state, NATS, a chDB ledger, a signed bundle). `make test` runs the
same test with a fixed seed and 3 examples per command; this runs --examples (default 40)
with --seed (default: from the clock, printed, so a failure can be replayed with
SCO_CLI_FUZZ_SEED). Prints one JSON report (bench/report.py): commands and cases run, the
failures (target 0) and the wall time.

    .venv/bin/python bench/cli_fuzz_bench.py [--examples 40] [--seed N] [--commands a,b] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import Report
from tests.support.paths import REPO

#: A command of each kind: a fleet-state write, a Temporal read, a NATS read, a ledger read.
TINY_COMMANDS = ["demand-set", "acquisitions-show", "pool-status", "ledger-decisions"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=40, help="cases per command")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--commands", default="", help="comma-separated command ids (default: every command)"
    )
    parser.add_argument("--tiny", action="store_true", help="1 case of each of 4 commands")
    args = parser.parse_args()
    examples = 1 if args.tiny else args.examples
    # The suite fuzzes every command (tests/workers/test_cli_fuzz.py); the tiny run proves
    # this bench's own path (its run, its summary, its report) on a few.
    only = [c for c in args.commands.split(",") if c] or (TINY_COMMANDS if args.tiny else [])
    select = "refuses_what_it_should_never_get"
    if only:
        select += " and (" + " or ".join(f"[{c}]" for c in only) + ")"
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    report = Report("cli_fuzz", {"examples_per_command": examples, "seed": seed})
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "cli-fuzz.json"
        env = {
            **os.environ,
            "SCO_CLI_FUZZ_EXAMPLES": str(examples),
            "SCO_CLI_FUZZ_SEED": str(seed),
            "SCO_CLI_FUZZ_SUMMARY": str(summary),
        }
        start = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                # Its own basetemp: a pytest that makes /tmp/pytest-of-<user> resets it to
                # 0700, and the suite beside it has services running as other users there.
                "--basetemp",
                str(Path(tmp) / "basetemp"),
                "--timeout",
                str(max(120, 15 * examples)),
                "tests/workers/test_cli_fuzz.py",
                "-k",
                select,
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.monotonic() - start
        anchor = f"seed {seed}, {examples} case(s) per command, in-process on the box"
        if not summary.is_file():
            tail = (done.stdout or done.stderr).strip().splitlines()[-3:]
            report.measurement_missing("commands", " ".join(tail)[:300], "commands", anchor=anchor)
            return report.emit()
        ran = json.loads(summary.read_text())
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED ")]
    report.figure("commands", ran["commands"], "commands", anchor=anchor)
    report.figure("cases", ran["cases"], "cases", anchor=anchor)
    report.figure("failures", len(failed), "cases", anchor=anchor, target=0, comparator="==")
    report.figure("wall", round(wall, 1), "s", anchor="pytest start to end, box included")
    report.details["failed"] = [line.removeprefix("FAILED ")[:300] for line in failed]
    return report.emit()


if __name__ == "__main__":
    sys.exit(main())
