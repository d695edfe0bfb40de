"""`sco sim estate`: a month of the three-region estate in simulated time, SCO's policies
against the peers' (estate/), written as JSON, PNG figures and a Markdown table."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from contracts.findings import errors
from contracts.region import RegionFileError, load_regions
from contracts.source import read_contracts
from estate.config import EstateConfig
from estate.engine import POLICIES, simulate
from estate.report import table
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
) -> None:
    """Simulate the estate and compare SCO's policies with price-only, Karpenter-like,
    SkyPilot-like and all-committed placement on the same trace."""
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
    try:
        regions = load_regions(regions_dir)
    except RegionFileError as exc:
        fail(str(exc))
    sources, findings = read_contracts(contracts_dir)
    if errors(findings):
        fail(str(errors(findings)[0]))
    unknown_regions = sorted(set(region) - set(regions))
    if unknown_regions:
        wrong, known = ", ".join(map(shown, unknown_regions)), ", ".join(regions)
        fail(f"--region: unknown {wrong}; known: {known}")
    unknown = sorted(set(policy) - set(POLICIES))
    if unknown:
        fail(f"--policy: unknown {', '.join(map(repr, unknown))}; known: {', '.join(POLICIES)}")
    try:
        cfg = EstateConfig(
            days=days,
            seed=seed,
            regions=tuple(region),
            tenants=tenants,
            tick_minutes=tick_minutes,
            exclusion_threshold=exclusion_threshold,
        )
        result = simulate(
            [regions[r] for r in sorted(regions)],
            [s.contract for s in sources],
            cfg,
            tuple(policy) or POLICIES,
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
