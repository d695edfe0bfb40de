"""`sco-agent [--config PATH] [--check] [--dry-run]`; config path also from SCO_AGENT_CONFIG."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from contracts.lean_imports import no_websockets_for_nats
from contracts.logformat import LOG_FORMATS, configure_logging, parse_format


def version() -> str:
    """The installed distribution's version: `sco-agent` (the node package, deploy/agent/)
    or `sco` (the repository's, where the agent runs as `python -m agent`)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    for dist in ("sco-agent", "sco"):
        try:
            return dist_version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


class _VersionAction(argparse.Action):
    """`--version`, read when asked for: the version lookup loads importlib.metadata
    (~1 MB) that a running agent would hold for nothing (decision 0026)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"sco-agent {version()}")  # on stdout, as argparse's own version action
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    # Before the daemon's modules import nats (contracts/lean_imports.py): ~10 MB of
    # aiohttp the agent never uses.
    no_websockets_for_nats()
    from agent.config import DEFAULT_PATH, ConfigError, load_config
    from agent.daemon import Agent, TimeSyncRefused, run_until_signalled
    from agent.natslink import NatsOptionsError

    parser = argparse.ArgumentParser(
        prog="sco-agent", description="SCO node agent: drains this node on a reclaim notice."
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ["SCO_AGENT_CONFIG"])
        if os.environ.get("SCO_AGENT_CONFIG")
        else None,
        help=f"TOML file (env SCO_AGENT_CONFIG; default {DEFAULT_PATH} when it exists)",
    )
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument("--check", action="store_true", help="validate config and bundle, exit 0/1")
    parser.add_argument("--dry-run", action="store_true", help="same as SCO_AGENT_DRY_RUN=true")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("SCO_AGENT_LOG_LEVEL", "INFO"),
        help="env SCO_AGENT_LOG_LEVEL",
    )
    parser.add_argument(
        "--log-format",
        default=os.environ.get("SCO_AGENT_LOG_FORMAT", "auto"),
        help=f"{' | '.join(LOG_FORMATS)}: json is one object per line, auto is text on a "
        "terminal and json otherwise (env SCO_AGENT_LOG_FORMAT)",
    )
    args = parser.parse_args(argv)
    try:
        log_format = parse_format(args.log_format, "--log-format or SCO_AGENT_LOG_FORMAT")
    except ValueError as exc:
        print(f"sco-agent: {exc}", file=sys.stderr)
        return 2
    configure_logging(log_format, args.log_level, sys.stderr)
    path: Path | None = args.config
    if path is None and DEFAULT_PATH.exists():
        path = DEFAULT_PATH
    env = dict(os.environ)
    if args.dry_run:
        env["SCO_AGENT_DRY_RUN"] = "true"
    if args.check:
        from agent.check import run_check, summary

        ok, lines = run_check(path, env)
        for line in lines:
            print(line.render())
        print(summary(ok, lines))
        return 0 if ok else 1
    try:
        config = load_config(path, env)
    except ConfigError as exc:
        print(f"sco-agent: bad configuration: {exc}", file=sys.stderr)
        return 2
    try:
        agent = Agent(config)
    except NatsOptionsError as exc:
        print(f"sco-agent: bad configuration: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(run_until_signalled(agent))
    except TimeSyncRefused as exc:
        print(f"sco-agent: not starting: {exc}", file=sys.stderr)
        return 2
    return 0
