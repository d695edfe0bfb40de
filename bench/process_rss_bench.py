"""Each long-running process's memory at start: its modules loaded as its command loads them.

    .venv/bin/python bench/process_rss_bench.py [--baseline /path/to/other/checkout] [--tiny]

A fresh interpreter per process loads what `sco <command>` loads before the process
connects anywhere (the CLI's guard, the command's module, the service's `run` from the
registry; the node agent: `sco-agent`'s main up to parsing its arguments, the daemon
imported), then waits; its VmRSS and RssAnon are read from /proc (bench/procstat.py). This
is the floor of each process's footprint: what it holds before its first connection, and
most of what a quiet one holds (the agent bench reads a connected agent's idle RSS).

Targets (issue 33, on the box): each notice relay <= 50 MB, the node agent <= 35 MB, the
region worker <= 300 MB (its start is far below; its working set grows with workflows).
With --baseline, the same processes of another checkout (its own venv's python, or this
one's) are measured in the same run, as `<name>_before` rows: the ratio holds on a noisy
machine. Prints one JSON report (bench/report.py).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import procstat
from bench.report import Report

#: process -> (how its command loads it, target MB or None). `a|b:name`: module a, or b in
#: a checkout without a (a baseline from before `sco notice-relay` left the typer CLI).
PROCESSES: dict[str, tuple[str, float | None]] = {
    "notice_relay": ("workers.cli.notice_relay|workers.cli.notices:notice-relay", 50.0),
    "drain_intake": ("workers.cli.ledger:drain-intake", 50.0),
    "outbox_relay": ("workers.cli.fleet:outbox-relay", None),
    "simulator": ("workers.cli.simulator:simulator", None),
    "ledger_consumer": ("workers.cli.ledger:ledger-consumer", None),
    "worker": ("workers.cli.control:worker", 300.0),
    "contract_sync": ("workers.cli.contracts:contract-sync", None),
    "agent": ("agent", 35.0),
}

# A baseline from before contracts/lean_imports.py loads without it.
_GUARD = (
    "try:\n"
    "    from contracts.lean_imports import no_websockets_for_nats\n"
    "    no_websockets_for_nats()\n"
    "except ImportError:\n"
    "    pass\n"
)
_WAIT = "import sys\nsys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.readline()\n"


def loader(how: str) -> str:
    if how == "agent":
        # What `sco-agent`'s main holds when it has parsed its arguments (agent.check
        # loads with --check only, the Kubernetes scheduler on Kubernetes nodes only).
        return _GUARD + "import agent.cli, agent.daemon, agent.natslink\n"
    cli_modules, name = how.split(":")
    cli_module, *older = cli_modules.split("|")
    load = f"import {cli_module}\n"
    if older:
        load = f"try:\n    {load}except ModuleNotFoundError:\n    import {older[0]}\n"
    return _GUARD + load + f"from services.registry import service\nservice({name!r}).load()\n"


def measure(python: str, root: Path, how: str) -> dict[str, float]:
    """VmRSS/RssAnon (MB) of a fresh interpreter of `root` that loaded process `how`."""
    proc = subprocess.Popen(
        [python, "-c", loader(how) + _WAIT],
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"{how} in {root}: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.2)  # bench: let the allocator settle before reading /proc
        return procstat.memory_mb(proc.pid)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=30)


def python_of(root: Path) -> str:
    venv = root / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", type=Path, help="another checkout, measured as *_before")
    ap.add_argument("--runs", type=int, default=3, help="fresh interpreters per process")
    ap.add_argument("--tiny", action="store_true", help="1 run each (CI smoke)")
    args = ap.parse_args()
    if args.tiny:
        args.runs = 1
    report = Report(
        "process_rss",
        {"runs": args.runs, "baseline": str(args.baseline) if args.baseline else None},
    )
    anchor = "VmRSS of a fresh interpreter that loaded the process as its command does"
    for name, (how, target) in PROCESSES.items():
        runs = [measure(sys.executable, ROOT, how) for _ in range(args.runs)]
        rss = statistics.median(r["VmRSS"] for r in runs)
        report.figure(
            f"{name}_start_rss",
            rss,
            "MB",
            anchor=f"{anchor}; median of {args.runs}",
            target=target,
            comparator="<=" if target is not None else None,
        )
        report.details[name] = {"rss_anon_mb": statistics.median(r["RssAnon"] for r in runs)}
        if args.baseline is not None:
            try:
                before = [
                    measure(python_of(args.baseline), args.baseline, how) for _ in range(args.runs)
                ]
            except RuntimeError as exc:  # the baseline may lack the guard or a module
                report.notes.append(f"{name} before: {exc}"[:300])
                continue
            report.figure(
                f"{name}_start_rss_before",
                statistics.median(r["VmRSS"] for r in before),
                "MB",
                anchor=f"{anchor}; {args.baseline}, median of {args.runs}",
            )
    return report.emit()


if __name__ == "__main__":
    raise SystemExit(main())
