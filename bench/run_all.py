"""Run every benchmark, one report: bench/results/latest.json and latest.md.

    .venv/bin/python bench/run_all.py [--tiny] [--only planner,floor] [--out bench/results]
        [--record NAME=FILE ...] [--readme README.md]

With --only, the named benches are run again and replace their entries in the report
already in --out (same --tiny), the others are kept as they were; each bench carries the
time it ran. --record puts a run made on its own into the report without running it again
(an hour's soak, a ramp with other settings: the JSON the bench printed, kept under
bench/results/runs/); its row says which file it came from.

Each bench runs as its own process (so one that hangs or dies is a failed bench, not a
dead report), one after another: the machine is shared and the figures are timings. A
bench whose tool is missing (bench/needs.py) is recorded as not run, with the reason. The
Markdown table lists every figure beside its target and anchor, met or missed; with
--readme it replaces the README's section between the bench markers. Exit status: 1 when
a bench failed or a measurement did not happen, else 0 (a missed target is a result).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import needs
from bench.report import REPORT_FILE_ENV

TINY_TIMEOUT_S = 90.0
STOP_GRACE_S = 120.0  # an overrun bench's clean-up (the test cloud's deletes)
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    full: tuple[str, ...]
    tiny: tuple[str, ...]
    needs: Callable[[], str | None]
    timeout_s: float  # of the full run
    # Of the tiny run: more only for benches that start several `sco`/agent processes,
    # whose Python start-up alone takes tens of seconds on a loaded machine.
    tiny_timeout_s: float = TINY_TIMEOUT_S


BENCHES = (
    # The suite's wall time from the last `make test` (runs nothing; first, it is instant).
    Bench("suite", "suite_bench.py", (), ("--tiny",), needs.suite_run, 60),
    Bench("outbox", "outbox_bench.py", (), ("--tiny",), needs.postgres, 600),
    Bench("contracts", "contracts_bench.py", (), ("--tiny",), lambda: None, 600),
    Bench("simulator", "simulator_bench.py", (), ("--tiny",), needs.nats, 600),
    Bench("planner", "planner_bench.py", (), ("--tiny",), lambda: None, 1800),
    Bench("estate", "estate_bench.py", (), ("--days", "2", "--tenants", "1"), lambda: None, 1200),
    # Four estate policies on one trace (a minute tiny; the full week of 3 regions ~10 min).
    Bench(
        "lifecycle", "lifecycle_bench.py", (), ("--tiny",), lambda: None, 1800, tiny_timeout_s=240
    ),
    Bench("control", "control_bench.py", (), ("--tiny",), needs.postgres, 900),
    Bench("controller_tick", "controller_tick_bench.py", (), ("--tiny",), lambda: None, 900),
    Bench("floor", "floor_bench.py", (), ("--tiny",), needs.postgres, 1800),
    Bench("slurm_resume", "slurm_resume_bench.py", (), ("--tiny",), needs.slurm, 900),
    Bench("agent", "agent_bench.py", (), ("--tiny",), needs.nats, 900),
    # With the agent's .deb built for this host's release (pip fetches its wheels: a
    # minute on a fresh machine) and measured under the release's own python3.
    Bench(
        "process_rss",
        "process_rss_bench.py",
        (),
        ("--tiny",),
        lambda: None,
        600,
        tiny_timeout_s=240,
    ),
    # Exact plans on the activity pool's 16 threads against the solver's 2 (issue 33).
    Bench("solver_threads", "solver_threads_bench.py", (), ("--tiny",), lambda: None, 300),
    # The operator's path through `sco`, on a `sco worker` and `sco sim serve` of its own.
    Bench(
        "operator_path",
        "operator_path_bench.py",
        (),
        ("--tiny",),
        needs.first(needs.postgres, needs.nats),
        900,
        tiny_timeout_s=240,
    ),
    Bench(
        "early_warning",
        "early_warning_bench.py",
        (),
        ("--tiny",),
        needs.first(needs.postgres, needs.nats),
        1200,  # 10 trials of 10 modelled minutes at 12x: ~10 min
        tiny_timeout_s=240,
    ),
    Bench("cli", "cli_bench.py", (), ("--tiny",), needs.postgres, 600),
    # The CLI fuzz's long run (tests/workers/test_cli_fuzz.py, 40 cases per command).
    Bench(
        "cli_fuzz",
        "cli_fuzz_bench.py",
        (),
        ("--tiny",),
        needs.first(needs.postgres, needs.nats),
        1800,
        tiny_timeout_s=240,
    ),
    # A floor of 6 made, a hall lost and restored: 50-80 s quiet, over 240 s beside two
    # CPU hogs (`make test-under-load`), where the test cloud's services share the cores.
    Bench(
        "floor_testcloud",
        "floor_testcloud_bench.py",
        (),
        ("--tiny",),
        needs.testcloud,
        1800,
        tiny_timeout_s=480,
    ),
    Bench("openstack", "openstack_bench.py", (), ("--tiny",), needs.testcloud, 900),
    Bench(
        "ledger_soak",
        "ledger_soak_bench.py",
        ("--png", "bench/results/ledger_soak_rss.png"),
        ("--tiny",),
        lambda: None,
        3600,
        tiny_timeout_s=240,
    ),
    Bench(
        "saturation",
        "saturation_bench.py",
        (),
        ("--tiny",),
        needs.first(needs.postgres, needs.nats),
        1500,
        tiny_timeout_s=240,
    ),
    # The secure box, every identity from OpenBao, renewed without a restart (issue 30);
    # the hour the issue asks: --ttl 600 --duration 3600, recorded with --record.
    Bench(
        "cert_renewal",
        "cert_renewal_bench.py",
        ("--ttl", "600", "--duration", "3600"),
        ("--tiny",),
        needs.secure_box,
        4200,
        tiny_timeout_s=240,
    ),
    Bench(
        "hall_fanout", "hall_fanout_bench.py", (), ("--tiny",), needs.nats, 1500, tiny_timeout_s=150
    ),
    # The box under churn, every process's memory curve: 20 min here; the hour-long run
    # (issue 33) is made alone and joined with --record memory_hour=FILE.
    Bench(
        "memory_hour",
        "memory_hour_bench.py",
        ("--minutes", "20"),
        ("--tiny",),
        needs.postgres,
        2400,
        tiny_timeout_s=420,  # the whole box comes up (Kafka, Temporal, OpenBao): minutes
    ),
    # A model from the per-unit costs above (the report's last runs, else the recorded
    # ones) and the estate simulator's month: the control plane's vCPU and memory beside
    # the seed's 145 vCPU (docs/footprint.md).
    Bench("footprint", "footprint_bench.py", (), ("--tiny",), lambda: None, 60),
)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def run_one(bench: Bench, tiny: bool) -> dict[str, Any]:
    result = _run_one(bench, tiny)
    result["run_at"] = now()
    return result


def child_env(report: Path) -> dict[str, str]:
    """A bench process's environment: where to write its report, and the test cloud's
    clouds.yaml where the needs check found it (the test-cloud benches use it)."""
    return {
        **os.environ,
        REPORT_FILE_ENV: str(report),
        "OS_CLIENT_CONFIG_FILE": needs.testcloud_config(),
    }


def _run_one(bench: Bench, tiny: bool) -> dict[str, Any]:
    if (reason := bench.needs()) is not None:
        return {"bench": bench.name, "status": "not run", "reason": reason}
    timeout = bench.tiny_timeout_s if tiny else bench.timeout_s
    argv = [sys.executable, str(ROOT / "bench" / bench.script), *(bench.tiny if tiny else ())]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "report.json"
        env = child_env(path)
        proc, overran = run_stopping_gracefully(argv, env, timeout)
        if overran:  # what it was doing: the end of its log
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])[-600:]
            why = f"no result in {timeout:.0f} s; its last lines: {tail or '(none)'}"
            return {"bench": bench.name, "status": "failed", "reason": why}
        text = path.read_text() if path.is_file() else ""
    wall = round(time.monotonic() - started, 1)
    try:
        out: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {
            "bench": bench.name,
            "status": "failed",
            "reason": f"exit {proc.returncode}, no JSON report: {tail}",
            "wall_s": wall,
        }
    out["status"] = "ok" if proc.returncode == 0 else "failed"
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        out["reason"] = f"exit {proc.returncode}: {tail}"
    return out


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_stopping_gracefully(
    argv: list[str], env: dict[str, str], timeout: float
) -> tuple[subprocess.CompletedProcess[str], bool]:
    """Run a bench: what it printed, and whether it overran. An overrun bench is
    interrupted (SIGINT: its `finally` blocks run) and given STOP_GRACE_S before it is
    killed: a bench on the test cloud deletes the servers and leases it made, which a kill
    left behind for the next test's floor to find the halls full."""
    with subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a bench that will not stop goes with its children
        # An interrupt must reach it: pytest-xdist's workers ignore SIGINT, and a child
        # started with SIGINT ignored keeps ignoring it (Python installs no handler then).
        preexec_fn=_interruptible,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The bench alone: the servers it started (a Temporal test server) stay up
            # for its clean-up.
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
            return subprocess.CompletedProcess(argv, proc.returncode, out, err), True
        return subprocess.CompletedProcess(argv, proc.returncode, out, err), False


def fmt(value: float | None) -> str:
    """Three or so significant digits: the machine's noise is larger than the rest."""
    if value is None:
        return "—"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}".removesuffix(".0")
    return f"{value:.3g}"


def markdown(report: dict[str, Any]) -> str:
    met = missed = unjudged = 0
    rows = []
    for b in report["benches"]:
        if b["status"] != "ok" and not b.get("figures"):
            rows.append(f"| {b['bench']} | — | — | — | — | **{b['status']}**: {b['reason']} |")
            continue
        m = b["machine"]
        load = f"load {m['loadavg_start'][0]:g}→{m['loadavg_end'][0]:g} on {m['cpus']} CPUs"
        for f in b["figures"]:
            target = f"{f['comparator']} {fmt(f['target'])}" if f["target"] is not None else "—"
            if f["value"] is None:
                result = f"**not measured**: {f['reason']}"
            elif f["met"] is True:
                result, met = "met", met + 1
            elif f["met"] is False:
                result, missed = "**missed**", missed + 1
            else:
                result, unjudged = "no target", unjudged + 1
            rows.append(
                f"| {b['bench']} | {f['name']} | {fmt(f['value'])} {f['unit']} | {target} "
                f"| {f['anchor']} | {result} |"
            )
        when = f", run {b['run_at']}" if "run_at" in b else ""
        rows.append(f"| {b['bench']} | _machine_ | {load}, {b['wall_s']:g} s{when} | | | |")
    head = (
        f"Generated by bench/run_all.py{' --tiny' if report['tiny'] else ''} "
        f"at {report['generated_at']}: {met} met, {missed} missed, {unjudged} without a "
        f"target, {report['not_measured']} not measured; benches not run: "
        f"{report['not_run']}.\n\n"
        "| Bench | Figure | Value | Target | Anchor (measured from / compared with) | Result |\n"
        "|---|---|---|---|---|---|\n"
    )
    notes = [f"- {b['bench']}: {n}" for b in report["benches"] for n in b.get("notes") or []]
    tail = "\n\n" + "\n".join(notes) + "\n" if notes else "\n"
    return head + "\n".join(rows) + tail


def replace_section(readme: Path, table: str) -> None:
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme}: markers {BEGIN} / {END} missing")
    before, rest = text.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    readme.write_text(f"{before}{BEGIN}\n{table}{END}{after}")


def recorded(spec: str, names: set[str]) -> tuple[str, dict[str, Any]]:
    """`NAME=FILE` of --record: the bench's report in FILE, checked against NAME."""
    name, sep, file = spec.partition("=")
    if not sep or not name or not file:
        raise SystemExit(f"--record {spec}: expected NAME=FILE")
    if name not in names:
        raise SystemExit(f"--record {spec}: unknown bench {name}")
    path = Path(file)
    try:
        out = json.loads(path.read_text())
    except OSError as exc:
        raise SystemExit(f"--record {spec}: {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SystemExit(
            f"--record {spec}: {path}: not JSON ({exc.msg}, line {exc.lineno})"
        ) from None
    if not isinstance(out, dict) or out.get("bench") != name:
        got = out.get("bench") if isinstance(out, dict) else type(out).__name__
        raise SystemExit(f"--record {spec}: {path}: field bench is {got!r}, not {name!r}")
    for field in ("figures", "machine", "wall_s"):
        if out.get(field) in (None, [], {}):
            raise SystemExit(f"--record {spec}: {path}: field {field} missing or empty")
    return name, {**out, "status": out.get("status", "ok"), "run_at": f"recorded in {file}"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="each bench in seconds (CI smoke)")
    ap.add_argument("--only", default="", help="comma-separated bench names")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--readme", type=Path, default=None, help="rewrite this README's section")
    ap.add_argument(
        "--record", action="append", default=[], metavar="NAME=FILE", help="a run made alone"
    )
    args = ap.parse_args()
    names = {b.name for b in BENCHES}
    only = {n for n in args.only.split(",") if n}
    unknown = only - names
    if unknown:
        raise SystemExit(f"--only: unknown bench {', '.join(sorted(unknown))}")
    records = dict(recorded(spec, names) for spec in args.record)
    if both := only & records.keys():
        raise SystemExit(f"--record and --only both name {', '.join(sorted(both))}")
    kept: dict[str, dict[str, Any]] = {}
    earlier = args.out / "latest.json"
    only |= records.keys()
    if only and earlier.is_file():
        old = json.loads(earlier.read_text())
        if old.get("tiny") == args.tiny:
            # A bench from before run times were kept ran by the time its report was written.
            kept = {b["bench"]: {"run_at": old["generated_at"], **b} for b in old["benches"]}
    results = []
    for bench in BENCHES:
        if bench.name in records:
            results.append(records[bench.name])
            continue
        if only and bench.name not in only:
            if bench.name in kept:
                results.append(kept[bench.name])
            continue
        print(f"bench {bench.name} ...", file=sys.stderr, flush=True)
        results.append(run_one(bench, args.tiny))
        print(f"bench {bench.name}: {results[-1]['status']}", file=sys.stderr, flush=True)
    report = {
        "generated_at": now(),
        "tiny": args.tiny,
        "benches": results,
        "failed": sum(r["status"] == "failed" for r in results),
        "not_run": sum(r["status"] == "not run" for r in results),
        "not_measured": sum(r.get("missing", 0) for r in results),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    (args.out / "latest.md").write_text(table)
    if args.readme is not None:
        replace_section(args.readme, table)
    print(table)
    return 1 if report["failed"] or report["not_measured"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
