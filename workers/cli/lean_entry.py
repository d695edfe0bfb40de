"""What the long-running processes' light entries share (workers/cli/notice_relay.py,
workers/cli/drain_intake.py; decision 0035): their errors, their options read without
argparse, their settings, and how `main` turns each failure into an exit status and one line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from workers.settings import Settings


class StartError(Exception):
    """The process cannot start; str() is the one line naming what and why."""


class UsageError(Exception):
    """The command line is not the command's; str() says what is wrong (the typer CLI's
    words), `see` whether the line points at the help (the typer CLI's does, but for an
    option without its value)."""

    def __init__(self, message: str, see: bool = True) -> None:
        super().__init__(message)
        self.see = see


def options(argv: Sequence[str], known: Sequence[str]) -> list[tuple[str, str]]:
    """(option, value) of each `--opt value` or `--opt=value` in `argv`, in order; every
    option in `known` takes a value. UsageError, as typer words it, for anything else."""
    found: list[tuple[str, str]] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name not in known:
            raise UsageError(
                f"No such option: {name}"
                if arg.startswith("-")
                else f"Got unexpected extra argument(s) ({arg})"
            )
        if not eq:
            if not args:
                raise UsageError(f"Option '{name}' requires an argument.", see=False)
            value = args.pop(0)
        found.append((name, value))
    return found


def settings() -> Settings:
    """The settings, logging configured from them; StartError naming file and field."""
    from workers.logs import configure_owned
    from workers.settings import SettingsError, load_settings

    try:
        s = load_settings()
    except SettingsError as exc:
        raise StartError(str(exc)) from None
    configure_owned(s.log)
    return s


def known_region(s: Settings, region: str) -> str:
    from workers.cli.plain import shown

    if region not in s.regions:
        raise StartError(f"unknown region {shown(region)} (known: {', '.join(s.regions)})")
    return region


def run_main(command: str, start: Callable[[], None]) -> NoReturn:
    """`sco COMMAND`'s exit: 0 when stopped, 1 with `error: <line>` on stderr when it
    cannot start or a dependency failed it, 2 on a usage error (as the typer CLI words it;
    `sco COMMAND --help` is the typer command's help), 130 on Ctrl-C."""
    from contracts.redact import mask_credentials

    try:
        start()
    except UsageError as exc:
        see = f" (see `sco {command} --help`)" if exc.see else ""
        print(f"error: {exc}{see}", file=sys.stderr)
        raise SystemExit(2) from None
    except StartError as exc:
        # Errors name the DSN or URL that failed; never its password (contracts/redact.py).
        print(f"error: {mask_credentials(str(exc))}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    raise SystemExit(0)
