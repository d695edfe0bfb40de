"""A typer group whose subcommands are imported only when one of them runs.

`sco --help` lists every subcommand from a one-line help kept here, and `sco demand set`
imports the demand commands' module and nothing else: the Temporal, NATS, Kafka and
ClickHouse clients load only for the commands that talk to them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import typer
from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:
    # Types only, never imported at run time: typer vendors Click as the private
    # `typer._click`, and the TyperGroup hooks overridden here (list_commands, get_command,
    # resolve_command) take and return its Context and Command, for which typer has no
    # public name (`typer.Context` is a subclass: narrower, so not a valid override
    # parameter). Typer's maintainers advise against using `typer._click`
    # (fastapi/typer discussion #1816); a rename there breaks mypy here, not `sco`.
    from typer import _click as click


@dataclass(frozen=True)
class Lazy:
    """A subcommand: `module:attribute` (a `typer.Typer` or a command function) and the
    one line `sco --help` shows for it (a test checks it against the command's own help)."""

    target: str
    help: str

    def load(self, name: str) -> click.Command:
        module, attr = self.target.split(":")
        obj = getattr(importlib.import_module(module), attr)
        if isinstance(obj, typer.Typer):
            # A group even with one command (`sco temporal bootstrap`, not `sco temporal`).
            return typer.main.get_group(obj)
        single = typer.Typer()
        single.command(name)(obj)
        return typer.main.get_command(single)


class LazyGroup(TyperGroup):
    """Set `lazy_commands` in a subclass; pass the subclass as `typer.Typer(cls=...)`."""

    lazy_commands: ClassVar[dict[str, Lazy]] = {}

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._loaded: dict[str, click.Command] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *self.lazy_commands]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The real command once loaded; for help listings a stand-in with the one-line help
        (listing must not import every module); shell completion loads the real one."""
        if cmd_name in self._loaded or (ctx.resilient_parsing and cmd_name in self.lazy_commands):
            return self.load(cmd_name)
        lazy = self.lazy_commands.get(cmd_name)
        if lazy is None:
            return super().get_command(ctx, cmd_name)
        return TyperCommand(name=cmd_name, help=lazy.help, short_help=lazy.help)

    def load(self, cmd_name: str) -> click.Command:
        if cmd_name not in self._loaded:
            self._loaded[cmd_name] = self.lazy_commands[cmd_name].load(cmd_name)
        return self._loaded[cmd_name]

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] in self.lazy_commands:
            return args[0], self.load(args[0]), args[1:]
        return super().resolve_command(ctx, args)
