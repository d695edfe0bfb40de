"""`sco ledger book-drains`: the region's drain intake, started without the CLI's machinery.

The intake runs for weeks beside the ledger consumer. Through the typer app it loaded
typer, click and rich, the commands' shared plumbing and the ledger's query commands,
~5 MB of its resident memory (issue 33, as 0035 did for the notice relay).
`sco ledger book-drains ...` comes here from workers/cli/entry.py;
`sco ledger book-drains --help` and the typer command (workers/cli/ledger.py, the CLI's
tests, docs/reference.md) go through the app. Both refuse a command line or a setting
with the same one line (tests/workers/test_drain_intake_entry.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from workers.cli import lean_entry
from workers.cli.lean_entry import StartError


def start(regions: Sequence[str]) -> None:
    """Settings and the regions; then the intake until it stops, a line per region.
    StartError when one of them is unusable or a dependency fails the intake."""
    import asyncio

    import nats
    import psycopg

    from activities.ledger.store import LedgerUnavailable
    from services.registry import service

    s = lean_entry.settings()
    for region in regions:
        lean_entry.known_region(s, region)
    try:
        progress = asyncio.run(service("drain-intake").load()(s, list(regions) or s.regions))
    except (nats.errors.Error, psycopg.Error, LedgerUnavailable, OSError) as exc:
        raise StartError(str(exc)) from None
    for name, p in progress.items():
        print(
            f"drain intake {name} stopped: {p.booked_reports} reports "
            f"({p.booked_rows} workload outcomes) booked, {p.malformed} malformed "
            f"({p.dead_lettered} dead-lettered)"
        )


def parse(argv: Sequence[str]) -> list[str]:
    """`--region R` (repeated; also `--region=R`): the regions, none meaning every one."""
    return [value for _, value in lean_entry.options(argv, ["--region"])]


def main(argv: Sequence[str]) -> NoReturn:
    """`sco ledger book-drains ARGS` (workers/cli/lean_entry.py's exit statuses)."""
    lean_entry.run_main("ledger book-drains", lambda: start(parse(argv)))
