"""The exact planner (HiGHS under a time budget, the greedy plan as cut-off and fallback):
on the small contended instances where the greedy tail is worst it reaches the optimum, it
is never worse than the greedy plan, and out of time it answers with the greedy plan."""

from __future__ import annotations

import subprocess
import sys

import pytest

from activities.control.exact_plan import ExactPlanInput, exact_plan
from planning.planner import plan
from tests.support.paths import REPO
from tests.support.planner_reference import (
    check_plan,
    contended_instance,
    gap_pct,
    milp_reference,
)

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("spread", [0.25, 0.1])
def test_within_one_percent_of_the_optimum_and_never_worse_than_greedy(spread: float) -> None:
    pytest.importorskip("scipy", reason="the exact planner needs scipy (HiGHS)")
    for seed in range(30):
        inp = contended_instance(seed).model_copy(update={"spread_max_pool_fraction": spread})
        greedy = plan(inp)
        res = exact_plan(ExactPlanInput(problem=inp, greedy=greedy, time_budget_seconds=10))
        check_plan(inp, res.plan)
        least, cheapest = milp_reference(inp)
        short = sum(o.shortfall_units for o in res.plan.outcomes)
        greedy_short = sum(o.shortfall_units for o in greedy.outcomes)
        assert short == least, f"seed {seed}: shortfall {short}, optimum {least}"
        assert gap_pct(res.plan.cost_per_hour, cheapest) <= 1.0, f"seed {seed}"
        assert (short, res.plan.cost_per_hour) <= (greedy_short, greedy.cost_per_hour + 1e-9)
        assert res.source in ("exact", "greedy")


def test_out_of_time_the_greedy_plan_stands() -> None:
    inp = contended_instance(7)
    greedy = plan(inp)
    res = exact_plan(ExactPlanInput(problem=inp, greedy=greedy, time_budget_seconds=1e-6))
    assert res.plan == greedy
    assert res.source == "greedy-timeout"


def test_a_warmed_worker_plans_exactly_without_importing() -> None:
    """warm_up (the worker, at start) leaves nothing for the first exact plan to import:
    the first demand change's tick does not wait for scipy."""
    pytest.importorskip("scipy", reason="the exact planner needs scipy (HiGHS)")
    code = (
        "import sys\n"
        "from activities.control.exact_plan import ExactPlanInput, exact_plan, warm_up\n"
        "from planning.planner import plan\n"
        "from tests.support.planner_reference import contended_instance\n"
        "inp = contended_instance(3)\n"
        "greedy = plan(inp)\n"
        "assert 'scipy' not in sys.modules\n"
        "assert warm_up()\n"
        "before = set(sys.modules)\n"
        "res = exact_plan(ExactPlanInput(problem=inp, greedy=greedy, time_budget_seconds=10))\n"
        "assert res.source in ('exact', 'greedy'), res.source\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith(('scipy', 'numpy'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
