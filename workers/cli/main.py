"""The `sco` command.

Subcommands load lazily (workers/cli/lazy.py): this module imports typer and nothing of
SCO's, so `sco --help` answers in a fraction of a second and each command imports only the
clients it uses.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import Any

import typer

from workers.cli.lazy import Lazy, LazyGroup

COMMANDS: dict[str, Lazy] = {
    "dev": Lazy(
        "workers.cli.dev:app", "Run the local region in a box (real processes, data under .sco/)."
    ),
    "temporal": Lazy("workers.cli.temporal:app", "Temporal set-up for a region."),
    "db": Lazy("workers.cli.fleet:db_app", "Fleet-state database."),
    "pools": Lazy("workers.cli.fleet:pools_app", "Pools (hall x SKU x size) in fleet state."),
    "instances": Lazy("workers.cli.fleet:instances_app", "SCO-owned instances in fleet state."),
    "outbox": Lazy("workers.cli.fleet:outbox_app", "The lifecycle-event outbox."),
    "worker": Lazy(
        "workers.cli.control:worker",
        "Serve the region's task queue until SIGTERM/Ctrl-C (graceful shutdown)",
    ),
    "demand": Lazy(
        "workers.cli.control:demand_app", "Demand per contract, in the contract's units."
    ),
    "slurm": Lazy(
        "workers.cli.schedulers:slurm_app",
        "Slurm power saving: CLOUD nodes SCO brings up and releases.",
    ),
    "acquisitions": Lazy("workers.cli.control:acq_app", "In-flight and past acquisitions."),
    "controller": Lazy("workers.cli.control:controller_app", "The region controller partitions."),
    "budget": Lazy("workers.cli.control:budget_app", "The region's provider API token budget."),
    "checkpoints": Lazy(
        "workers.cli.checkpoints:app", "Checkpoint storage per contract on Ceph RGW (S3)."
    ),
    "floor": Lazy("workers.cli.floor:floor_app", "Committed floors of tier-1 contracts."),
    "hall": Lazy(
        "workers.cli.floor:hall_app", "Declare a hall lost or restored to the floor keepers."
    ),
    "lifecycle": Lazy(
        "workers.cli.lifecycle:lifecycle_app",
        "Voluntary disruption (drift, return from fallback, expiry, consolidation): "
        "the lifecycle workflow.",
    ),
    "pool": Lazy(
        "workers.cli.exclusion:pool_app", "Pool exclusion: keep reclaim-prone pools out of plans."
    ),
    "ledger": Lazy("workers.cli.ledger:app", "Spend and reclaim history in the ClickHouse ledger."),
    "contracts": Lazy(
        "workers.cli.contracts:app", "Contracts: compile, sign, verify, publish, admission."
    ),
    "keys": Lazy(
        "workers.cli.keys:app", "Notice relays' per-hall signing keys: make, retire, list."
    ),
    "sim": Lazy(
        "workers.cli.simulator:sim_app", "The simulated cloud (the embedded default provider)."
    ),
    "notice-relay": Lazy("workers.cli.notices:notice_relay", "Run the hall's notice relay"),
    "reclaim": Lazy(
        "workers.cli.notices:reclaim",
        "Ask the hall's notice relay to reclaim an instance or a whole pool (recorded).",
    ),
    "reconcile": Lazy(
        "workers.cli.reconcile:reconcile",
        "Compare provider servers and leases with fleet state: delete orphans, mark ghosts.",
    ),
    "explain": Lazy(
        "workers.cli.explain:app",
        "Why: a contract short, an instance running, a pool excluded (from recorded reasons).",
    ),
    "estate": Lazy(
        "workers.cli.estate_status:estate_app",
        "The estate across regions: floors, reclaimable capacity, exclusions, "
        "acquisitions, approvals and spend, per region and hall.",
    ),
    "console": Lazy(
        "workers.cli.console:console", "Serve the read-only operator console until SIGTERM/Ctrl-C"
    ),
    "docs": Lazy(
        "workers.cli.reference:docs_app",
        "Generated documentation: docs/reference.md from the CLI and the settings.",
    ),
    "nats-users": Lazy(
        "workers.cli.notices:nats_users",
        "Render the region's NATS users with least-privilege permissions (deploy/nats/).",
    ),
}


class SCOGroup(LazyGroup):
    lazy_commands = COMMANDS

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Every way a command ends is its exit status and at most one line on stderr: a
        usage error (exit 2) is `error: <what> (see <command> --help)`, not click's
        usage block; an exception nobody expected is one line naming it (exit 1), its
        traceback only under `-v`."""
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except typer.TyperException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":
                # `sco demand`: the group's help, as click shows it.
                exc.show()  # type: ignore[attr-defined]  # click's UsageError.show
                sys.exit(exc.exit_code)
            ctx = getattr(exc, "ctx", None)
            # `sco`, also when run in-process (typer's CliRunner names the program "root").
            path = _command_path(ctx) if ctx is not None else ""
            see = f" (see `{path} --help`)" if path else ""
            _error_line(f"{exc.format_message()}{see}")
            sys.exit(exc.exit_code)
        except typer.Abort:
            _error_line("aborted")
            sys.exit(1)
        except KeyboardInterrupt:
            sys.exit(130)
        except SystemExit:
            raise
        except Exception as exc:
            from workers import logs

            if logs.verbose():
                traceback.print_exc()
            _error_line(
                f"unexpected {type(exc).__name__}: {_one_line(str(exc))} (`sco -v ...` shows where)"
            )
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _command_path(ctx: Any) -> str:
    """`sco demand set`: the context's command names under the root, whatever the program
    was called (`python -m workers.cli`, typer's CliRunner)."""
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return " ".join(["sco", *reversed(names)])


def _one_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return (lines[0] if lines else "")[:300]


def _error_line(message: str) -> None:
    print(f"error: {_one_line(message)}", file=sys.stderr)


app = typer.Typer(
    cls=SCOGroup,
    help="SCO: the Spot Capacity Orchestrator control plane.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        import importlib.metadata

        typer.echo(f"sco {importlib.metadata.version('sco')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_version, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(
        False, "-v", "--verbose", help="Also the command's own INFO log lines (on stderr)."
    ),
) -> None:
    """SCO: the Spot Capacity Orchestrator control plane."""
    from workers.logs import set_verbose

    set_verbose(verbose)


def main() -> None:
    # Before any command imports nats: its WebSocket transport's aiohttp stays out of
    # every `sco` process, the long-running ones above all (contracts/lean_imports.py).
    from contracts.lean_imports import no_websockets_for_nats

    no_websockets_for_nats()
    # Before a command loads its settings; the command configures again from them.
    from workers.logs import configure_from_env

    configure_from_env()
    code = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    # The command is done and has closed what it opened; what may still run is native
    # (Temporal's core runtime, librdkafka): leave without interpreter finalization, which
    # such threads can crash (PyGILState_Release at exit), so the exit status is the
    # command's own.
    if "workers.tracing" in sys.modules:
        from workers import tracing

        tracing.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
