"""`sco notice-relay`: the hall's notice relay, started without the CLI's machinery.

A relay runs for weeks, one per hall: it loads neither typer (the `sco` app) nor rich (the
CLI's tables) nor the commands' shared plumbing (workers/cli/common.py), ~2 MB of each
relay's resident memory (decision 0035). `sco notice-relay ...` comes here from
workers/cli/entry.py; `sco notice-relay --help` and the typer command in
workers/cli/notices.py (the CLI's tests, docs/reference.md) call the same `start`, so both
check the same things and fail with the same one line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NoReturn

from workers.cli import lean_entry
from workers.cli.lean_entry import StartError as StartError
from workers.cli.lean_entry import UsageError


def start(region: str | None, hall: str, sweep_seconds: float) -> None:
    """Settings, the region and its hall, the signing key; then the relay until it stops.
    StartError when one of them is unusable or a dependency fails the relay."""
    import asyncio

    import nats
    import psycopg

    from contracts import keys
    from contracts.region import RegionFileError, load_region
    from services.notice_relay.keyfile import KeyFileSigner
    from services.registry import service

    s = lean_entry.settings()
    region_id = lean_entry.known_region(s, s.region if region is None else region)
    try:
        region_model = load_region(s.region_file(region_id))
    except (RegionFileError, FileNotFoundError) as exc:
        raise StartError(str(exc)) from None
    if hall not in region_model.halls:
        raise StartError(
            f"--hall {hall!r}: region {region_model.id} has halls {', '.join(region_model.halls)}"
        )
    if not math.isfinite(sweep_seconds):
        raise StartError(f"--sweep-seconds {sweep_seconds}: not a finite number")
    if not 0.01 <= sweep_seconds <= 3600:
        raise StartError(f"--sweep-seconds {sweep_seconds:g}: outside [0.01, 3600]")
    key_file, setting = s.notices.key_file(hall)
    if key_file is None:
        raise StartError(
            f"notices.hall_key_files.{hall} and notices.signing_key_file "
            "(SCO_NOTICES__SIGNING_KEY_FILE): neither set; nodes refuse unsigned notices"
        )
    try:
        signing_key = KeyFileSigner(key_file, region=region_model.id, hall=hall)
    except keys.KeyFileError as exc:
        raise StartError(f"{setting}: {exc}") from None
    try:
        asyncio.run(
            service("notice-relay").load()(
                s, region_model, hall, signing_key, sweep_seconds=sweep_seconds
            )
        )
    except (nats.errors.Error, psycopg.Error, OSError) as exc:
        raise StartError(str(exc)) from None


#: option -> (its `start` argument, how its value is read); their help is the typer
#: command's (workers/cli/notices.py), which `sco notice-relay --help` shows.
OPTIONS: dict[str, tuple[str, type[str] | type[float]]] = {
    "--region": ("region", str),
    "--hall": ("hall", str),
    "--sweep-seconds": ("sweep_seconds", float),
}


def parse(argv: Sequence[str]) -> dict[str, Any]:
    """`--region R --hall H --sweep-seconds S` (each also `--opt=value`) as `start`'s
    arguments. Three options need no argparse (and its gettext: ~0.3 MB)."""
    values: dict[str, Any] = {"region": None, "sweep_seconds": 1.0}
    for name, value in lean_entry.options(argv, list(OPTIONS)):
        key, kind = OPTIONS[name]
        try:
            values[key] = kind(value)
        except ValueError:
            raise UsageError(
                f"Invalid value for '{name}': Input should be a valid number, unable to "
                "parse string as a number"
            ) from None
    if "hall" not in values:
        raise UsageError("Missing option '--hall'.")
    return values


def main(argv: Sequence[str]) -> NoReturn:
    """`sco notice-relay ARGS` (workers/cli/lean_entry.py's exit statuses)."""
    lean_entry.run_main("notice-relay", lambda: start(**parse(argv)))
