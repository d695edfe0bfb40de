"""The `sco` program (console script and `python -m workers.cli`): the long-running
processes that need none of the CLI start here without it.

`sco notice-relay ...` (one per hall, for weeks) goes to workers/cli/notice_relay.py and
`sco ledger book-drains ...` (the drain intake) to workers/cli/drain_intake.py; neither
loads typer, rich or the commands' plumbing (decision 0035). Everything else, and their
`--help`, is the typer app in workers/cli/main.py.
"""

from __future__ import annotations

import sys


def main() -> None:
    # Before any command imports nats: its WebSocket transport's aiohttp stays out of
    # every `sco` process (contracts/lean_imports.py).
    from contracts.lean_imports import no_websockets_for_nats

    no_websockets_for_nats()
    args = sys.argv[1:]
    helped = bool({"-h", "--help"} & set(args))
    if args[:1] == ["notice-relay"] and not helped:
        from workers.cli import notice_relay
        from workers.logs import configure_from_env

        configure_from_env()  # before its settings load, as `sco`'s main does
        notice_relay.main(args[1:])
    if args[:2] == ["ledger", "book-drains"] and not helped:
        from workers.cli import drain_intake
        from workers.logs import configure_from_env

        configure_from_env()
        drain_intake.main(args[2:])
    from workers.cli.main import main as typer_main

    typer_main()
