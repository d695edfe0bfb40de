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

import sys
from collections.abc import Sequence
from typing import NoReturn

from workers.cli.notice_relay import StartError, UsageError


def start(regions: Sequence[str]) -> None:
    """Settings and the regions; then the intake until it stops, a line per region.
    StartError when one of them is unusable or a dependency fails the intake."""
    import asyncio

    import nats
    import psycopg

    from activities.ledger.store import LedgerUnavailable
    from services.registry import service
    from workers.cli.plain import shown
    from workers.logs import configure_owned
    from workers.settings import SettingsError, load_settings

    try:
        s = load_settings()
    except SettingsError as exc:
        raise StartError(str(exc)) from None
    configure_owned(s.log)
    for region in regions:
        if region not in s.regions:
            raise StartError(f"unknown region {shown(region)} (known: {', '.join(s.regions)})")
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
    regions: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name != "--region":
            raise UsageError(
                f"No such option: {name}"
                if arg.startswith("-")
                else f"Got unexpected extra argument(s) ({arg})"
            )
        if not eq:
            if not args:
                raise UsageError(f"Option '{name}' requires an argument.", see=False)
            value = args.pop(0)
        regions.append(value)
    return regions


def main(argv: Sequence[str]) -> NoReturn:
    """`sco ledger book-drains ARGS`: exit 0 when stopped, 1 with `error: <line>` on stderr
    when it cannot start or a dependency failed it, 2 on a usage error (as typer words it)."""
    from contracts.redact import mask_credentials

    try:
        start(parse(argv))
    except UsageError as exc:
        see = " (see `sco ledger book-drains --help`)" if exc.see else ""
        print(f"error: {exc}{see}", file=sys.stderr)
        raise SystemExit(2) from None
    except StartError as exc:
        # Errors name the DSN or URL that failed; never its password (contracts/redact.py).
        print(f"error: {mask_credentials(str(exc))}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    raise SystemExit(0)
