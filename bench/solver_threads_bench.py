"""What the controllers' exact plans cost the worker's memory, by the threads they run on.

HiGHS keeps state for every thread that ever called it (a thread-local task executor),
and each such thread has its own malloc arena, for the thread's life. The region worker
used to solve on its activity pool (16 threads, whichever was free), so it grew each time
one of them took its first solve (issue 33: the worker's creep); it now solves on
`worker.solver_threads` threads of their own (activities/control/activities.py).

Each way is measured in a fresh interpreter that loaded the scientific stack and solved
once (the worker's warm-up): VmRSS before and after `--plans` exact plans of the
contended instances, spread over the activity pool's 16 threads, or on the solver's 2.

    .venv/bin/python bench/solver_threads_bench.py [--plans 32] [--tiny]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import Report
from contracts.bounded import loads

# Run in a fresh interpreter: the plans on `threads` threads (each thread solves in turn
# until every one has solved), VmRSS before and after, in MB.
_CHILD = """
import concurrent.futures, json, sys, threading
from activities.control.exact_plan import ExactPlanInput, exact_plan, warm_up
from planning.planner import plan
from tests.support.planner_reference import contended_instance

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024

plans, threads = int(sys.argv[1]), int(sys.argv[2])
problems = [contended_instance(seed) for seed in range(plans)]
requests = [ExactPlanInput(problem=p, greedy=plan(p), time_budget_seconds=2) for p in problems]
warm_up()
exact_plan(requests[0])
before = rss()
barrier = threading.Barrier(threads)
def solve(i):
    if i < threads:
        barrier.wait(30)  # every thread of the pool takes one of the first solves
    return exact_plan(requests[i]).source
with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
    sources = list(pool.map(solve, range(plans)))
print(json.dumps({"before": before, "after": rss(), "sources": sorted(set(sources))}))
"""


def measure(plans: int, threads: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(plans), str(threads)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"solver child exited {done.returncode}: {done.stderr[-500:]}")
    last = done.stdout.strip().splitlines()[-1].encode()
    out: dict[str, float] = loads(last, what="solver child's report", max_bytes=4096)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=32, help="exact plans per way")
    ap.add_argument("--tiny", action="store_true", help="16 plans (CI smoke)")
    args = ap.parse_args()
    plans = 16 if args.tiny else args.plans
    report = Report("solver_threads", {"plans": plans})
    pool, solver = measure(plans, 16), measure(plans, 2)
    anchor = f"VmRSS after {plans} exact plans minus after one (the worker's warm-up)"
    pool_growth = pool["after"] - pool["before"]
    solver_growth = solver["after"] - solver["before"]
    report.figure(
        "growth_on_activity_pool", pool_growth, "MB", anchor=f"{anchor}; 16 threads (before)"
    )
    report.figure(
        "growth_on_solver_threads",
        solver_growth,
        "MB",
        anchor=f"{anchor}; worker.solver_threads = 2",
    )
    report.figure(
        "solver_over_pool_growth",
        solver_growth / pool_growth if pool_growth > 0 else 0.0,
        "x",
        anchor="the two growths of this run, in one run",
        target=0.5,
        comparator="<=",
    )
    report.details.update(pool=pool, solver=solver)
    return report.emit()


if __name__ == "__main__":
    raise SystemExit(main())
