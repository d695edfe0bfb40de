"""The box under churn for an hour: every process's memory curve, and its growth.

    .venv/bin/python bench/memory_hour_bench.py [--minutes 60] [--interval 30]
        [--churn-seconds 60] [--tracemalloc FRAMES] [--tiny]

A region in a box of its own, as `make up` brings it (`sco dev up --workers`: Temporal's
dev server, Kafka, OpenBao, NATS, the simulated cloud, the region worker, a notice relay
per hall, the outbox relay, the drain intake, the ledger consumer; PostgreSQL is a scratch
database on the machine's server), on a block of free ports and a data dir of its own
(as tests/workers/test_devbox.py isolates one) with a NATS server of its own, so it
collides with no test and no other box. Beside it one node agent (`python -m agent`, hall
A of r1) on the box's NATS, idle as a node between notices is.

Churn, as `make up` and an operator make it: the pool catalogue synced, then the three
example contracts' demand set (`sco demand set`, the controllers start acquisitions),
and every --churn-seconds one change in turn: a contract's demand moved up or down (its
controller acquires or releases), an operator's reclaim of one ACTIVE instance
(`sco reclaim`: the hall's relay notices it, the region worker's notice hook and the
controller's replacement follow), or an operator's read of the ledger (`sco ledger spend`
or `decisions`: the ledger consumer runs it, decision 0044). Each `sco` command is its
own process, as an operator runs it.

Every --interval seconds the VmRSS of every process the box recorded (summed over its
process tree: a server started through a wrapper counts whole) and of the agent is read
from /proc. Per process the report has its VmRSS at the end (the median of the last 5
samples) and its growth over the last half of the run: the median slope between every two
samples of the last half (Theil-Sen) times that half's length (a curve that only wanders
has ~0; a leak has its rate; a sample that caught a short-lived child moves neither), held to
max(1 MB, 2 % of its RSS) (issue 33: no growth in the last half hour). The worker and
the notice relays are also held to their RSS targets (300 MB, 50 MB). The curves are in
details.curves ([seconds since the first sample, MB]); --record memory_hour=FILE joins
a run made alone into `make bench`'s report (bench/run_all.py).

With --tracemalloc FRAMES the box's processes run traced (PYTHONTRACEMALLOC, workers/
memory_trace.py): each armed one is sent SIGUSR2 at the half and at the end, and
details.tracemalloc has, per process, its traced Python memory at both and the tracebacks
that grew most between them (what `sco dev memory-diff` prints). Tracing costs memory and
CPU, so a traced run's RSS figures are reported without their targets: it says where the
growth is, an untraced run says how much.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
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
from bench.scrape import metric
from tests.support import services
from tests.support.paths import BASE_DSN, REGIONS_DIR
from workers import procstat

REGION = "r1"
SCO = str(Path(sys.executable).parent / "sco")
#: The example contracts `make up` gives demand to, and the range churn moves them in.
DEMAND: dict[str, tuple[int, int, int]] = {  # contract: (make up's, low, high)
    "spark-etl": (120, 60, 180),
    "ci-runners": (200, 100, 260),
    "search-api": (40, 20, 60),
}
#: RSS targets (issue 33), by the box's process name prefix.
RSS_TARGETS = {"worker-": 300.0, "notice-relay-": 50.0, "agent": 35.0}


def growth_mb(curve: list[tuple[float, float]]) -> float | None:
    """The slope of (t, MB) over the last half of the run, times its length: the median of
    the slopes between every two samples (Theil-Sen). A sample that caught a short-lived
    child in a process tree (the worker's ledger queries run in a child of ~230 MB for a
    few seconds) moves a least-squares line by megabytes; it moves the median of the
    pairwise slopes by nothing while such samples are few."""
    if len(curve) < 4:
        return None
    end = curve[-1][0]
    half = [(t, v) for t, v in curve if t >= end / 2]
    slopes = [
        (v2 - v1) / (t2 - t1)
        for i, (t1, v1) in enumerate(half)
        for t2, v2 in half[i + 1 :]
        if t2 > t1
    ]
    if len(half) < 3 or not slopes:
        return None
    return statistics.median(slopes) * (half[-1][0] - half[0][0])


def end_mb(curve: list[tuple[float, float]]) -> float:
    """The RSS at the end: the median of the last 5 samples, so a sample that caught a
    short-lived child (see `growth_mb`) is not the figure."""
    return statistics.median(v for _, v in curve[-5:])


def box_env(tmp: Path, dsn: str) -> dict[str, str]:
    base = services.free_port_range(24)
    return {
        "SCO_DATA_DIR": str(tmp / "sco"),
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_POSTGRES_DSN": dsn,
        "SCO_NATS_URL": f"nats://127.0.0.1:{base + 7}",  # the box runs its own
        "SCO_TEMPORAL__ADDRESS": f"127.0.0.1:{base}",
        "SCO_TEMPORAL__UI_PORT": str(base + 1),
        "SCO_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{base + 2}",
        "SCO_OPENBAO__ADDRESS": f"https://127.0.0.1:{base + 3}",
        "SCO_PROMETHEUS__PORT": str(base + 5),
        "SCO_PROMETHEUS__BOX_PORTS_FROM": str(base + 8),
        "SCO_REGION": REGION,
    }


class Churn:
    def __init__(self, env: dict[str, str], log: Path, seed: int = 33) -> None:
        # An operator's commands are not traced, whatever the box is.
        self.env = {k: v for k, v in {**os.environ, **env}.items() if k != "PYTHONTRACEMALLOC"}
        self.log = log
        self.rng = random.Random(seed)
        self.demand = {c: d for c, (d, _, _) in DEMAND.items()}
        self.turn = itertools.cycle(["demand", "reclaim", "demand", "ledger"])
        self.reads = itertools.cycle(["spend", "decisions"])
        self.commands = 0
        self.failed: list[str] = []

    def sco(self, *args: str, timeout: float = 180) -> bool:
        started = time.monotonic()
        try:
            out = subprocess.run(
                [SCO, *args],
                env=self.env,
                cwd=ROOT,
                text=True,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
            ok, tail = out.returncode == 0, (out.stderr.strip().splitlines() or [""])[-1]
        except subprocess.TimeoutExpired:
            ok, tail = False, f"no answer in {timeout:.0f} s"
        self.commands += 1
        with self.log.open("a") as f:
            f.write(
                f"{time.time():.0f} {'ok' if ok else 'FAILED'} {time.monotonic() - started:.1f}s "
                f"sco {' '.join(args)} {'' if ok else tail}\n"
            )
        if not ok:
            self.failed.append(f"sco {' '.join(args)}: {tail}"[:200])
        return ok

    def start(self) -> None:
        self.sco("pools", "sync", "--region", REGION)
        for contract, units in self.demand.items():
            self.sco("demand", "set", contract, str(units), "--region", REGION)

    def step(self, active: list[str]) -> None:
        turn = next(self.turn)
        if turn == "reclaim" and active:
            self.sco("reclaim", self.rng.choice(active), "--reason", "memory bench churn")
            return
        if turn == "ledger":
            self.sco("ledger", next(self.reads), "--window", "1h", "--region", REGION)
            return
        contract = self.rng.choice(sorted(self.demand))
        _, low, high = DEMAND[contract]
        self.demand[contract] = self.rng.randint(low, high)
        self.sco("demand", "set", contract, str(self.demand[contract]), "--region", REGION)


def active_instances(dsn: str) -> list[str]:
    """Up to 200 ACTIVE reclaimable instances of the region (fleet state: a floor's
    committed ones are refused to a reclaim without --force), none when it is away."""
    import psycopg

    from activities.events import CapacityType, InstanceState
    from activities.fleet.db import open_pool
    from activities.fleet.repository import FleetRepository

    try:
        pool = open_pool(dsn, max_size=1)
    except psycopg.Error:
        return []
    try:
        rows = FleetRepository(pool).list_instances(REGION, [InstanceState.ACTIVE])
    except psycopg.Error:
        return []
    finally:
        pool.close()
    ids = [r.instance_id for r in rows if r.capacity_type is CapacityType.RECLAIMABLE]
    return ids[:200]


def start_agent(tmp: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    from workers.settings import Settings

    trust = Settings().trust_dir
    config = tmp / "agent.toml"
    config.write_text(
        f'node_id = "memory-bench-node"\nregion = "{REGION}"\nhall = "A"\nscheduler = "none"\n'
        f'nats_urls = ["{env["SCO_NATS_URL"]}"]\ncache_dir = "{tmp / "agent-cache"}"\n'
        f'trust_dir = "{trust}"\njournal_path = "{tmp / "agent" / "journal.jsonl"}"\n'
        f'socket_dir = "{tmp / "agent-s"}"\n'
    )
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "--config", str(config), "--log-level", "WARNING"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "agent.log").open("wb"),
    )


def run(
    args: argparse.Namespace, report: Report, tmp: Path
) -> dict[str, list[tuple[float, float]]]:
    from workers.devbox.box import Box
    from workers.settings import Settings

    dsn = services.scratch_database(BASE_DSN)
    env = box_env(tmp, dsn)
    curves: dict[str, list[tuple[float, float]]] = {}
    agent: subprocess.Popen[bytes] | None = None
    traced = {"PYTHONTRACEMALLOC": str(args.tracemalloc)} if args.tracemalloc else {}
    snapshots: list[dict[str, Path]] = []  # the armed processes' files, at the half and end
    with services.environment({**env, **traced}):
        box = Box(Settings(), with_workers=True)
        try:
            t_up = time.monotonic()
            box.up()
            report.details["box_up_s"] = round(time.monotonic() - t_up, 1)
            agent = start_agent(tmp, env)
            churn = Churn(env, tmp / "churn.log")
            churn.start()
            pids = {n: r.pid for n, r in box.state_file.read().processes.items()}
            pids["agent"] = agent.pid
            report.details["pids"] = pids
            t0 = time.monotonic()
            end = t0 + args.minutes * 60
            next_sample, next_churn = t0, t0 + args.churn_seconds
            half_taken = not traced
            while True:
                now = time.monotonic()
                if not half_taken and now >= t0 + args.minutes * 30:
                    snapshots.append(take_snapshots(tmp / "sco" / "diagnostics", 1))
                    half_taken = True
                if now >= next_sample:
                    kids = procstat.children_by_parent()
                    for name, pid in pids.items():
                        if (mb := procstat.tree_rss_mb(pid, kids)) is not None:
                            curves.setdefault(name, []).append((round(now - t0, 1), round(mb, 2)))
                    print(
                        f"sample at {now - t0:.0f} s: {len(curves)} processes",
                        file=sys.stderr,
                        flush=True,
                    )
                    next_sample += args.interval
                if now >= end:
                    break
                if now >= next_churn:
                    churn.step(active_instances(dsn))
                    next_churn = time.monotonic() + args.churn_seconds
                time.sleep(max(0.0, min(next_sample, next_churn, end) - time.monotonic()))
            if traced:
                snapshots.append(take_snapshots(tmp / "sco" / "diagnostics", 2))
                report.details["tracemalloc"] = compare_snapshots(*snapshots)
                if args.snapshots_to is not None:  # the files outlive the box's data dir
                    args.snapshots_to.mkdir(parents=True, exist_ok=True)
                    for taken in snapshots:
                        for path in taken.values():
                            shutil.copy2(path, args.snapshots_to / path.name)
            report.details["churn_commands"] = churn.commands
            report.details["churn_failed"] = churn.failed[:20]
            report.details["active_instances_at_end"] = len(active_instances(dsn))
            report.details["ledger_engine_releases"] = engine_releases(tmp / "sco" / "logs")
            # What the consumer answered without letting the ledger go (decision 0043).
            port = environ(pids["ledger-consumer"]).get("SCO_LEDGER_METRICS_PORT")
            if port:
                report.details["ledger_holder_answers"] = metric(
                    int(port), "sco_ledger_holder_answers_total"
                )
            gone = sorted(n for n, pid in pids.items() if procstat.rss_mb(pid) is None)
            if gone:
                report.notes.append(f"exited during the run: {', '.join(gone)}")
        finally:
            if agent is not None and agent.poll() is None:
                agent.terminate()
                try:
                    agent.wait(30)
                except subprocess.TimeoutExpired:
                    agent.kill()
            box.down()
            services.drop_database(dsn)
    return curves


def environ(pid: int) -> dict[str, str]:
    """The environment a process of the box was started with (its ports are in it)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(
        item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item
    )


def engine_releases(logs: Path) -> int:
    """How often the ledger consumer let its embedded ledger go for another process (its
    log's lines, services/ledger_consumer/consumer.py): each reopen leaves ~2 MB in chDB,
    the steps of its curve."""
    from services.ledger_consumer.consumer import RELEASE_LOGGED

    return sum(
        f.read_text(errors="replace").count(RELEASE_LOGGED)
        for f in logs.glob("ledger-consumer*.log")
    )


def take_snapshots(directory: Path, n: int, wait_s: float = 900.0) -> dict[str, Path]:
    """SIGUSR2 to every armed process (workers/memory_trace.py); its n-th snapshot's path,
    by the `.armed` file's stem (<service>-<pid>), once written. A traced worker of half an
    hour takes minutes to write one on a loaded machine: `wait_s` is generous. A process
    that armed again after the signal (the ledger consumer re-executes itself past
    `ledger.recycle_rss_mb`, same pid) lost it: it is not waited for."""
    import signal

    from workers.memory_trace import SUFFIX

    armed = {f.stem: f for f in directory.glob("*.armed")}
    sent = time.time()
    for stem in armed:
        try:
            os.kill(int(stem.rsplit("-", 1)[1]), signal.SIGUSR2)
        except ProcessLookupError:
            continue
    wanted = {stem: directory / f"{stem}-{n}{SUFFIX}" for stem in armed}

    def rearmed(stem: str) -> bool:
        try:
            return armed[stem].stat().st_mtime >= sent
        except FileNotFoundError:
            return True  # gone: nothing to wait for

    def waiting() -> list[str]:
        return [s for s, path in wanted.items() if not path.is_file() and not rearmed(s)]

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and waiting():
        time.sleep(1)
    return {stem: p for stem, p in wanted.items() if p.is_file()}


def compare_snapshots(half: dict[str, Path], end: dict[str, Path]) -> dict[str, object]:
    """Per armed process: traced MB at the half and the end, the 8 tracebacks that grew."""
    from workers import memory_trace

    out: dict[str, object] = {}
    for stem in sorted(set(half) & set(end)):
        before, after = memory_trace.load(half[stem]), memory_trace.load(end[stem])
        out[stem] = {
            "traced_mb_half": round(memory_trace.total_kb(before) / 1024, 2),
            "traced_mb_end": round(memory_trace.total_kb(after) / 1024, 2),
            "grown": [
                {**g.as_dict(), "frames": list(g.frames[-4:])}
                for g in memory_trace.growth(before, after, 8)
            ],
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60.0, help="how long the box runs")
    ap.add_argument("--interval", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--churn-seconds", type=float, default=60.0, help="seconds between changes")
    ap.add_argument(
        "--tracemalloc",
        type=int,
        default=0,
        metavar="FRAMES",
        help="run the box's processes traced, FRAMES frames (1-64); RSS targets not judged",
    )
    ap.add_argument(
        "--snapshots-to",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --tracemalloc: keep the snapshots there (for sco dev memory-diff)",
    )
    ap.add_argument("--tiny", action="store_true", help="30 s, samples every 5 s (CI smoke)")
    args = ap.parse_args()
    if not 0 <= args.tracemalloc <= 64:
        ap.error("--tracemalloc: 1 to 64 frames (0: not traced)")
    if args.tiny:
        args.minutes, args.interval, args.churn_seconds = 0.5, 5.0, 10.0
    if args.minutes <= 0 or args.interval <= 0 or args.churn_seconds <= 0:
        ap.error("--minutes, --interval, --churn-seconds: above 0")
    report = Report(
        "memory_hour",
        {
            "minutes": args.minutes,
            "interval_s": args.interval,
            "churn_seconds": args.churn_seconds,
            "region": REGION,
            "tracemalloc_frames": args.tracemalloc,
        },
    )
    if args.tracemalloc:
        report.notes.append(
            "traced run (PYTHONTRACEMALLOC): RSS includes the tracer's own; targets not judged"
        )
    with tempfile.TemporaryDirectory(prefix="sco-memhour-") as tmp:
        curves = run(args, report, Path(tmp))
    report.details["curves"] = curves
    half = f"last {args.minutes / 2:g} min"
    for name in sorted(curves):
        curve = curves[name]
        at_end = end_mb(curve)
        target = next((t for p, t in RSS_TARGETS.items() if name.startswith(p)), None)
        target = None if args.tracemalloc else target
        report.figure(
            f"{name}_rss_end",
            at_end,
            "MB",
            anchor=f"VmRSS (process tree), median of the last 5 samples of {args.minutes:g} min"
            " of box churn",
            target=target,
            comparator="<=" if target is not None else None,
        )
        grown = growth_mb(curve)
        anchor = f"Theil-Sen slope x length over the {half}, {len(curve)} samples in all"
        if grown is None:
            report.measurement_missing(
                f"{name}_growth_last_half",
                "fewer than 3 samples in the last half",
                "MB",
                anchor=anchor,
            )
            continue
        report.figure(
            f"{name}_growth_last_half",
            grown,
            "MB",
            anchor=anchor,
            target=None if args.tracemalloc else round(max(1.0, 0.02 * at_end), 1),
            comparator=None if args.tracemalloc else "<=",
        )
    if "ledger-consumer" in curves:
        # Not judged: what the consumer's steps are made of. Each reopen of the embedded
        # ledger after another process took it leaves ~2 MB in chDB (since decisions 0043
        # and 0044 only a process writing to it itself, or an answer too big for the
        # holder's socket); a ClickHouse server ledger has none, and
        # `ledger.recycle_rss_mb` bounds the embedded one.
        report.figure(
            "ledger-consumer_engine_releases",
            report.details.get("ledger_engine_releases", 0),
            "reopens",
            anchor=f"the consumer's log over the {args.minutes:g} min: the embedded ledger let"
            " go for another process and opened again",
        )
    if "ledger-consumer" in curves and report.details.get("ledger_holder_answers") is not None:
        report.figure(
            "ledger-consumer_holder_answers",
            report.details["ledger_holder_answers"],
            "requests",
            anchor="sco_ledger_holder_answers_total at the end: the worker's reclaim-rate"
            " reads, the intake's drain bookings and the operator's ledger queries the"
            " consumer answered on the ledger's socket, keeping it open",
        )
    if not curves:
        report.measurement_missing("rss", "no process was sampled", "MB", anchor="the box")
    return report.emit()


if __name__ == "__main__":
    raise SystemExit(main())
