"""Each long-running process's memory at start: its modules loaded as its command loads them.

    .venv/bin/python bench/process_rss_bench.py [--baseline /path/to/other/checkout] [--tiny]

A fresh interpreter per process loads what `sco <command>` loads before the process
connects anywhere (the CLI's guard, the command's module, the service's `run` from the
registry; the node agent: `sco-agent`'s main up to parsing its arguments, the daemon
imported), then waits; its VmRSS and RssAnon are read from /proc (workers/procstat.py). This
is the floor of each process's footprint: what it holds before its first connection, and
most of what a quiet one holds (the agent bench reads a connected agent's idle RSS).

The agent is measured twice: as the box runs it (`python -m agent`, this venv's Python),
and as its package ships it (`agent_deb_start_rss`: the .deb built for this host's Debian
release, loaded by the release's own `/usr/bin/python3 -I`; no row on a host without one).

Targets (issue 33, on the box): each notice relay <= 50 MB, the node agent <= 35 MB, the
region worker <= 300 MB (its start is far below; its working set grows with workflows).
With --baseline, the same processes of another checkout (its own venv's python, or this
one's) are measured in the same run, as `<name>_before` rows: the ratio holds on a noisy
machine. Prints one JSON report (bench/report.py).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import Report
from workers import procstat

#: process -> (how its command loads it, target MB or None). `a|b:name`: module a, or b in
#: a checkout without a (a baseline from before `sco notice-relay` left the typer CLI).
PROCESSES: dict[str, tuple[str, float | None]] = {
    "notice_relay": ("workers.cli.notice_relay|workers.cli.notices:notice-relay", 50.0),
    "drain_intake": ("workers.cli.drain_intake|workers.cli.ledger:drain-intake", 50.0),
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


def measure(
    python: str, root: Path, how: str, *, flags: tuple[str, ...] = (), prelude: str = ""
) -> dict[str, float]:
    """VmRSS/RssAnon (MB) of a fresh interpreter of `root` that loaded process `how`
    (`flags` for the interpreter, `prelude` run before the loading)."""
    proc = subprocess.Popen(
        [python, *flags, "-c", prelude + loader(how) + _WAIT],
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


#: The Debian release whose own python3 the agent's package is built for (build-deb.sh).
DEB_TARGETS = {"3.11": "debian12", "3.13": "debian13"}
SYSTEM_PYTHON = "/usr/bin/python3"


def shipped_agent(runs: int, report: Report) -> None:
    """The node agent as its package runs it: deploy/agent/build-deb.sh's .deb for this
    host's release, unpacked and byte-compiled as its postinst does, loaded by the
    release's own `python3 -I` (the launcher's interpreter; not the venv's, whose libpython
    and site-packages differ). No row where the host has no such python3 or no dpkg-deb:
    that host cannot run the package; a failed build is a failed measurement."""
    name, target = "agent_deb_start_rss", PROCESSES["agent"][1]
    anchor = f"VmRSS of {SYSTEM_PYTHON} -I that loaded the .deb's agent as sco-agent does"
    if not Path(SYSTEM_PYTHON).exists() or shutil.which("dpkg-deb") is None:
        report.notes.append(f"{name}: no {SYSTEM_PYTHON} or dpkg-deb here, not measured")
        return
    version = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if (release := DEB_TARGETS.get(version)) is None:
        report.notes.append(f"{name}: no package target for python3 {version}, not measured")
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [str(ROOT / "deploy" / "agent" / "build-deb.sh"), "--target", release, "--out", tmp],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            report.measurement_missing(name, f"build-deb.sh: {last}"[:300], "MB", anchor=anchor)
            return
        (deb,) = Path(tmp).glob("sco-agent_*.deb")
        subprocess.run(["dpkg-deb", "-x", str(deb), f"{tmp}/root"], check=True)
        lib = f"{tmp}/root/usr/lib/sco-agent"
        subprocess.run([SYSTEM_PYTHON, "-m", "compileall", "-q", "-j", "0", lib], check=True)
        prelude = f"import sys\nsys.path.insert(0, {lib!r})\n"  # as /usr/bin/sco-agent does
        measured = [
            measure(SYSTEM_PYTHON, Path(tmp), "agent", flags=("-I",), prelude=prelude)
            for _ in range(runs)
        ]
    report.figure(
        name,
        statistics.median(r["VmRSS"] for r in measured),
        "MB",
        anchor=f"{anchor} ({release}, python3 {version}); median of {runs}",
        target=target,
        comparator="<=",
    )


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
    shipped_agent(args.runs, report)
    return report.emit()


if __name__ == "__main__":
    raise SystemExit(main())
