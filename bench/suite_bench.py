"""The test suite's own budget: `make test`'s wall time from its last run, against 18 min.

    .venv/bin/python bench/suite_bench.py [--junit .sco/test-results.xml]
        [--fixtures .sco/fixture-times.json] [--tiny]

Reads what the last `make test` left (JUnit XML: the session's wall time, tests passed,
failed, skipped, each test's time; the session fixtures' set-up times of
tests/support/timing.py) and runs nothing itself: the suite takes minutes and the bench
report must not. A report with no run behind it is a missing measurement, with the command.
--tiny reads the same files (the figures are already measured).
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import Report

#: The CI issue's budget for `make test` on this 2-core machine kind (pytest's part).
TARGET_S = 18 * 60
ANCHOR = "pytest session start to end, the last `make test` (JUnit XML testsuite time)"


def read_junit(path: Path) -> dict[str, float]:
    suites = ET.parse(path).getroot()
    suite = suites if suites.tag == "testsuite" else suites[0]
    return {k: float(suite.get(k, 0)) for k in ("time", "tests", "failures", "errors", "skipped")}


def slowest(path: Path, n: int = 10) -> list[dict[str, object]]:
    cases = [
        (float(c.get("time", 0)), f"{c.get('classname')}::{c.get('name')}")
        for c in ET.parse(path).getroot().iter("testcase")
    ]
    return [{"test": name, "s": round(t, 1)} for t, name in sorted(cases, reverse=True)[:n]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--junit", type=Path, default=ROOT / ".sco" / "test-results.xml")
    ap.add_argument("--fixtures", type=Path, default=ROOT / ".sco" / "fixture-times.json")
    ap.add_argument("--tiny", action="store_true", help="the same: nothing is run")
    args = ap.parse_args()
    report = Report("suite", {"junit": str(args.junit), "target_s": TARGET_S})
    if not args.junit.is_file():
        report.measurement_missing(
            "suite_wall",
            f"{args.junit} missing: run `make test` first",
            "s",
            anchor=ANCHOR,
            target=TARGET_S,
            comparator="<=",
        )
        return report.emit()
    run = read_junit(args.junit)
    report.figure("suite_wall", run["time"], "s", anchor=ANCHOR, target=TARGET_S, comparator="<=")
    passed = run["tests"] - run["failures"] - run["errors"] - run["skipped"]
    report.figure("tests_passed", passed, "tests", anchor="the same run")
    report.figure(
        "tests_failed", run["failures"] + run["errors"], "tests", anchor="the same run",
        target=0, comparator="==",
    )  # fmt: skip
    report.details["slowest"] = slowest(args.junit)
    if args.fixtures.is_file():
        report.details["session_fixture_setup_s"] = json.loads(args.fixtures.read_text())
    return report.emit()


if __name__ == "__main__":
    raise SystemExit(main())
