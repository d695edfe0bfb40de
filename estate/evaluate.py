"""The evaluation of issue 34: every policy on >= 10 paired trace windows per scenario,
SCO's parameters frozen in a file (estate/frozen_params.json), means with 95 % confidence
intervals, and SCO measured against the *best* fair baseline.

Paired: within a window every policy runs on the same trace (common random numbers), so
SCO's effect is the mean of per-window differences. A relative effect is the mean paired
difference over the baseline's mean, its interval the difference's t-interval scaled the
same way. Pure apart from reading the frozen file and the dataset; the caller renders.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from contracts.model import Contract
from contracts.region import Region
from estate.config import EstateConfig
from estate.dctrace import convert, series_from
from estate.engine import ABLATIONS, BASELINES, POLICIES, simulate
from estate.results import PolicySummary
from estate.trace import RegionTrace
from estate.tracefile import parse_trace

#: The measures every policy is held to (estate.results.PolicySummary), lower is better.
METRICS: tuple[str, ...] = (
    "cost_per_served_unit_hour",
    "unserved_unit_hours",
    "p99_time_to_capacity_minutes",
    "work_lost_per_1000_unit_hours",
    "below_floor_minutes",
    "fallback_refused_units",
    "voluntary_releases",
)
#: The goal: this much less work lost than the best baseline ...
GOAL_LOST = -0.25
#: ... at most this much dearer per served unit-hour, floor minutes no worse.
GOAL_COST = 0.05
FROZEN = Path(__file__).with_name("frozen_params.json")
#: Student's t, 97.5th percentile, for 1..30 degrees of freedom.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    """Student's t quantile for a two-sided 95 % interval (beyond 30 degrees of freedom
    1.96 + 2.5 / df, within 0.002 of the exact value)."""
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.5 / df


class FrozenError(ValueError):
    """The frozen parameter file cannot be used; one line."""


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")
    about: str = ""
    days: float
    seeds: list[int] = []
    dataset: str | None = None
    windows: list[int] = []
    seed: int = 1
    csv: str | None = None
    """A CSV with the dataset's columns instead of the installed package's (relative to the
    frozen file)."""
    generator: dict[str, Any] = {}
    """Settings of the synthetic generator for this scenario (estate.config.EstateConfig
    fields; not SCO's parameters, which are the file's ``sco``)."""


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid")
    about: str
    frozen: str
    tuned_on: str
    sco: dict[str, float]
    scenarios: dict[str, Scenario]
    regions: list[str]
    tenants: int


def load_frozen(path: Path = FROZEN) -> tuple[Frozen, str]:
    """The frozen parameters and the file's sha256."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise FrozenError(f"{path}: {exc.strerror or exc}") from None
    try:
        frozen = Frozen.model_validate_json(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "(top)"
        raise FrozenError(f"{path}: {field}: {err['msg']}") from None
    unknown = sorted(set(frozen.sco) - set(EstateConfig.model_fields))
    if unknown:
        raise FrozenError(f"{path}: sco.{unknown[0]}: not a parameter of the simulator")
    for name, scenario in frozen.scenarios.items():
        wrong = sorted(set(scenario.generator) - set(EstateConfig.model_fields))
        if wrong:
            raise FrozenError(f"{path}: scenarios.{name}.generator.{wrong[0]}: not a setting")
        clash = sorted(set(scenario.generator) & set(frozen.sco))
        if clash:
            raise FrozenError(
                f"{path}: scenarios.{name}.generator.{clash[0]}: one of SCO's frozen parameters"
            )
    return frozen, hashlib.sha256(raw).hexdigest()


def config(frozen: Frozen, **changes: Any) -> EstateConfig:
    """The simulator's settings with SCO's frozen parameters."""
    return EstateConfig.model_validate(
        {**frozen.sco, "regions": tuple(frozen.regions), "tenants": frozen.tenants, **changes}
    )


class Window(BaseModel):
    scenario: str
    label: str
    source: str
    metrics: dict[str, dict[str, float]]  # policy -> metric -> value


class Interval(BaseModel):
    mean: float
    low: float
    high: float
    n: int


class Comparison(BaseModel):
    policy: str
    baseline: str
    lost: Interval  # relative change of work lost per 1,000 useful unit-hours
    cost: Interval  # relative change of cost per served unit-hour
    floor_minutes: Interval  # difference of minutes below floor (policy - baseline)
    unserved: Interval  # relative change of unserved unit-hours
    goal_met: bool
    goal_met_confidently: bool


class ScenarioReport(BaseModel):
    scenario: str
    about: str
    windows: list[Window]
    summary: dict[str, dict[str, Interval]]  # policy -> metric -> mean with interval
    best_baseline: str
    comparisons: list[Comparison]


class Evaluation(BaseModel):
    frozen_file: str
    frozen_sha256: str
    tuned_on: str
    frozen: str
    regions: list[str]
    tenants: int
    policies: list[str]
    scenarios: list[ScenarioReport]
    verdict: str


def interval(values: Sequence[float]) -> Interval:
    """Mean and 95 % t-interval."""
    n = len(values)
    mean = statistics.fmean(values) if values else 0.0
    if n < 2:
        return Interval(mean=mean, low=-math.inf, high=math.inf, n=n)
    half = t975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean=mean, low=mean - half, high=mean + half, n=n)


def relative(diffs: Sequence[float], base: Sequence[float]) -> Interval:
    """Mean paired difference over the baseline's mean, with its interval scaled alike."""
    d = interval(diffs)
    scale = statistics.fmean(base) if base else 0.0
    if not scale:
        return Interval(mean=0.0 if not d.mean else math.inf, low=d.low, high=d.high, n=d.n)
    return Interval(mean=d.mean / scale, low=d.low / scale, high=d.high / scale, n=d.n)


def measures(p: PolicySummary) -> dict[str, float]:
    return {m: float(getattr(p, m)) for m in METRICS}


def scenario_traces(
    name: str,
    scenario: Scenario,
    regions: dict[str, Region],
    frozen: Frozen,
    base: Path = FROZEN.parent,
) -> list[tuple[str, str, EstateConfig, dict[str, RegionTrace]]]:
    """(label, source, config, traces by region) per window of a scenario."""
    out: list[tuple[str, str, EstateConfig, dict[str, RegionTrace]]] = []
    if scenario.dataset is None:
        for seed in scenario.seeds:
            cfg = config(frozen, **scenario.generator, days=scenario.days, seed=seed)
            out.append((f"seed {seed}", "synthetic (calibrated generator)", cfg, {}))
        return out
    csv = base / scenario.csv if scenario.csv else None
    series, where = series_from(scenario.dataset, csv)
    for w in scenario.windows:
        traces: dict[str, RegionTrace] = {}
        minutes = 0
        source = ""
        for rid in frozen.regions:
            doc = convert(
                series, regions[rid], window=w, days=scenario.days, seed=scenario.seed,
                source=where,
            )  # fmt: skip
            traces[rid] = parse_trace(doc, regions[rid], f"{name} window {w}", scenario.seed)
            minutes, source = doc["minutes"], doc["source"]
        cfg = config(frozen, days=minutes / 1440, seed=scenario.seed)
        out.append((f"window {w}", source, cfg, traces))
    return out


def run_scenario(
    name: str,
    scenario: Scenario,
    regions: dict[str, Region],
    contracts: Sequence[Contract],
    frozen: Frozen,
    policies: Sequence[str] = POLICIES,
    progress: Callable[[str], None] = lambda _: None,
    base: Path = FROZEN.parent,
) -> list[Window]:
    ordered = [regions[r] for r in sorted(regions)]
    out = []
    for label, source, cfg, traces in scenario_traces(name, scenario, regions, frozen, base):
        result = simulate(ordered, contracts, cfg, policies, traces or None)
        out.append(
            Window(
                scenario=name,
                label=label,
                source=source,
                metrics={p.policy: measures(p) for p in result.policies},
            )
        )
        progress(f"{name} {label}")
    return out


def compare(name: str, about: str, windows: Sequence[Window]) -> ScenarioReport:
    policies = list(windows[0].metrics)
    summary = {
        p: {m: interval([w.metrics[p][m] for w in windows]) for m in METRICS} for p in policies
    }
    baselines = [b for b in BASELINES if b in policies]
    best = min(baselines, key=lambda b: (summary[b]["work_lost_per_1000_unit_hours"].mean, b))
    comparisons = []
    for p in [x for x in ("sco", *ABLATIONS) if x in policies]:
        for b in baselines:
            comparisons.append(paired(p, b, windows))
    return ScenarioReport(
        scenario=name,
        about=about,
        windows=list(windows),
        summary=summary,
        best_baseline=best,
        comparisons=comparisons,
    )


def paired(policy: str, baseline: str, windows: Sequence[Window]) -> Comparison:
    def series(p: str, m: str) -> list[float]:
        return [w.metrics[p][m] for w in windows]

    def rel(m: str) -> Interval:
        mine, theirs = series(policy, m), series(baseline, m)
        return relative([a - b for a, b in zip(mine, theirs, strict=True)], theirs)

    lost, cost, unserved = (
        rel("work_lost_per_1000_unit_hours"),
        rel("cost_per_served_unit_hour"),
        rel("unserved_unit_hours"),
    )
    floor = interval(
        [
            a - b
            for a, b in zip(
                series(policy, "below_floor_minutes"),
                series(baseline, "below_floor_minutes"),
                strict=True,
            )
        ]
    )
    return Comparison(
        policy=policy,
        baseline=baseline,
        lost=lost,
        cost=cost,
        floor_minutes=floor,
        unserved=unserved,
        goal_met=lost.mean <= GOAL_LOST and cost.mean <= GOAL_COST and floor.mean <= 0,
        goal_met_confidently=lost.high <= GOAL_LOST and cost.high <= GOAL_COST and floor.high <= 0,
    )


def verdict(reports: Sequence[ScenarioReport]) -> str:
    lines = []
    for r in reports:
        c = next(c for c in r.comparisons if c.policy == "sco" and c.baseline == r.best_baseline)
        met = "MET" if c.goal_met else "NOT MET"
        lines.append(
            f"{r.scenario}: against the best baseline ({r.best_baseline}) SCO loses "
            f"{c.lost.mean:+.0%} work per useful unit-hour [95 % CI {c.lost.low:+.0%}, "
            f"{c.lost.high:+.0%}] at {c.cost.mean:+.1%} cost per served unit-hour "
            f"[{c.cost.low:+.1%}, {c.cost.high:+.1%}], {c.floor_minutes.mean:+.1f} minutes "
            f"below floor [{c.floor_minutes.low:+.1f}, {c.floor_minutes.high:+.1f}]: goal "
            f"(<= -25 % work lost, <= +5 % cost, floor no worse) {met}"
            + (" with 95 % confidence" if c.goal_met_confidently else "")
            + "."
        )
    return "\n".join(lines)


def evaluate(
    regions: dict[str, Region],
    contracts: Sequence[Contract],
    frozen_path: Path = FROZEN,
    scenarios: Sequence[str] = (),
    policies: Sequence[str] = POLICIES,
    max_windows: int | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> Evaluation:
    frozen, digest = load_frozen(frozen_path)
    missing = sorted(set(frozen.regions) - set(regions))
    if missing:
        raise FrozenError(f"{frozen_path}: regions: {missing[0]} is not among the loaded regions")
    names = list(scenarios) or list(frozen.scenarios)
    unknown = sorted(set(names) - set(frozen.scenarios))
    if unknown:
        raise FrozenError(
            f"scenario {unknown[0]!r}: not in {frozen_path} (has {', '.join(frozen.scenarios)})"
        )
    reports = []
    for name in names:
        sc = frozen.scenarios[name]
        if max_windows is not None:
            sc = sc.model_copy(
                update={"seeds": sc.seeds[:max_windows], "windows": sc.windows[:max_windows]}
            )
        windows = run_scenario(
            name, sc, regions, contracts, frozen, policies, progress, frozen_path.parent
        )
        reports.append(compare(name, sc.about, windows))
    return Evaluation(
        frozen_file=str(frozen_path),
        frozen_sha256=digest,
        tuned_on=frozen.tuned_on,
        frozen=frozen.frozen,
        regions=frozen.regions,
        tenants=frozen.tenants,
        policies=list(policies),
        scenarios=reports,
        verdict=verdict(reports),
    )


def _ci(i: Interval, fmt: str) -> str:
    if not math.isfinite(i.low):
        return format(i.mean, fmt)
    return f"{format(i.mean, fmt)} [{format(i.low, fmt)}, {format(i.high, fmt)}]"


def table(ev: Evaluation) -> str:
    """Markdown: per scenario, every policy's measures (mean [95 % CI]) and SCO and its
    ablations against the best baseline."""
    out = []
    for r in ev.scenarios:
        n = len(r.windows)
        out.append(f"**{r.scenario}** ({n} paired windows; {r.about}). Best baseline by work "
                   f"lost: **{r.best_baseline}**.\n")  # fmt: skip
        out.append(
            "| policy | cost / served unit-h | unserved unit-h | p99 time to capacity (min) "
            "| work lost / 1,000 useful unit-h | minutes below floor "
            "| fallback refused (unit-steps) "
            "| voluntary releases |\n|---|---:|---:|---:|---:|---:|---:|---:|"
        )
        for p, s in r.summary.items():
            out.append(
                f"| {p} | {_ci(s['cost_per_served_unit_hour'], '.4f')} "
                f"| {_ci(s['unserved_unit_hours'], ',.0f')} "
                f"| {_ci(s['p99_time_to_capacity_minutes'], '.1f')} "
                f"| {_ci(s['work_lost_per_1000_unit_hours'], '.3f')} "
                f"| {_ci(s['below_floor_minutes'], '.1f')} "
                f"| {_ci(s['fallback_refused_units'], ',.0f')} "
                f"| {_ci(s['voluntary_releases'], ',.0f')} |"
            )
        out.append("")
        out.append(
            f"| vs {r.best_baseline} | work lost | cost / served unit-h | minutes below floor "
            "| unserved | goal met |\n|---|---:|---:|---:|---:|---|"
        )
        for c in r.comparisons:
            if c.baseline != r.best_baseline:
                continue
            out.append(
                f"| {c.policy} | {_ci(c.lost, '+.0%')} | {_ci(c.cost, '+.1%')} "
                f"| {_ci(c.floor_minutes, '+.1f')} | {_ci(c.unserved, '+.0%')} "
                f"| {'yes' if c.goal_met else 'no'} |"
            )
        out.append("")
    out.append(ev.verdict)
    out.append("")
    out.append(
        f"SCO's parameters: `{ev.frozen_file}` (sha256 {ev.frozen_sha256[:12]}…, frozen "
        f"{ev.frozen}); tuned on: {ev.tuned_on}"
    )
    return "\n".join(out)
