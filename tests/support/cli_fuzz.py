"""The `sco` fuzz: every command of the typer app, argument values an operator should never
get away with, and the state they must leave alone.

Commands are enumerated from `workers.cli.main.app` (the lazy groups loaded), so a new
command is fuzzed by construction. Each case gives one *culprit* a value that is wrong for
any command (empty, blank, control characters, far too long, NaN, infinite, a number past
any bound, a path under a file, an unexpected extra argument) and every other argument a
value that may or may not be right (other regions, unknown ids, unicode, small numbers):
the command must refuse, and refuse before it writes, signals or starts anything. Used by
tests/workers/test_cli_fuzz.py (a fixed seed in `make test`) and bench/cli_fuzz_bench.py
(a longer run).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import typer
from hypothesis import strategies as st
from temporalio.client import Client
from typer.testing import CliRunner

from workers.cli.main import app

#: The most a refused command may print on stderr, and the longest it may take.
MAX_ERROR_LINES = 2
MAX_SECONDS = 10.0
#: When a case is stopped (it fails then as slower than MAX_SECONDS).
HARD_STOP_SECONDS = 30.0
#: The region the fuzz box runs a worker for; the others have a namespace and no worker.
BOX_REGION = "r1"
REGIONS = ("r1", "r2", "r3")
EXTRA = "__extra__"  # the culprit "an argument the command does not take"


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]
    params: tuple[Any, ...]  # typer's parameters (click Parameter subclasses)

    @property
    def name(self) -> str:
        return " ".join(self.path)


def commands() -> list[Command]:
    """Every leaf command of `sco`, from the app itself."""
    out: list[Command] = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        if hasattr(cmd, "lazy_commands"):
            for name in cmd.lazy_commands:
                walk(cmd.load(name), (*path, name))
        elif hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, (*path, name))
        else:
            params = tuple(
                p
                for p in cmd.params
                if p.name not in {"install_completion", "show_completion", "help"}
            )
            out.append(Command(path, params))

    walk(typer.main.get_command(app), ())
    return out


def kind(param: Any) -> str:
    annotation = param.type_descriptor.annotation
    text = getattr(annotation, "__name__", None) or repr(annotation)
    if annotation is bool:
        return "bool"
    if annotation is int:
        return "int"
    if annotation is float:
        return "float"
    if annotation is Path:
        return "path"
    if annotation is dt.datetime:
        return "datetime"
    if text.startswith("list["):
        return "list"
    return "str"


# -- values --------------------------------------------------------------------------------

_BAD_TEXT = ["", " ", "\t \n", "bad\x07bell", "\x1b[31mred", "x" * 5000, "\u202e\u200b"]
_BAD_NUMBER = [
    "",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e309",
    "99999999999999999999",
    "-99999999999999999999",
    "x",
]
_MAYBE_TEXT = [
    "r1",
    "r2",
    "r3",
    "r9",
    "A",
    "Z",
    "ci-runners",
    "llm-train",
    "no-such-contract",
    "acq-r2-ci-runners-0123456789",
    "acq-r1-no-such-0123456789",
    "r2.A.gp.l",
    "r1.Z.gp.l",
    "r1.A.gp.l",
    "Ä",
    "ünïcödé-名前",
    "x",
    "-1",
]
_MAYBE_NUMBER = ["0", "1", "-1", "5", "0.5"]


def bad_values(k: str, scratch: Path) -> list[str]:
    """Values wrong for any parameter of kind K (SCRATCH holds a file `a-file`)."""
    not_a_dir = str(scratch / "a-file" / "x")
    return {
        "str": _BAD_TEXT,
        "list": _BAD_TEXT,
        "int": _BAD_NUMBER,
        "float": _BAD_NUMBER,
        "path": ["", " ", not_a_dir, str(scratch / ("x" * 5000))],
        "datetime": ["", "x", "99999-99-99", "nan"],
    }.get(k, [])


def maybe_values(k: str, scratch: Path) -> list[str]:
    """Values that may be right (the culprit makes the case wrong): never relative paths."""
    return {
        "str": _MAYBE_TEXT,
        "list": _MAYBE_TEXT,
        "int": _MAYBE_NUMBER,
        "float": _MAYBE_NUMBER,
        "path": [str(scratch / "no-such-file"), str(scratch / "out.txt"), str(scratch)],
        "datetime": ["2026-01-01T00:00:00", "1970-01-01"],
    }.get(k, [])


@st.composite
def argv(draw: st.DrawFn, command: Command, scratch: Path) -> list[str]:
    """One case for COMMAND: the culprit wrong, the other arguments whatever they draw."""
    culprits = [p for p in command.params if bad_values(kind(p), scratch)] + [EXTRA]
    culprit = draw(st.sampled_from(culprits))
    positional: list[str] = []
    options: list[str] = []
    for p in command.params:
        k = kind(p)
        if k == "bool":
            if draw(st.booleans()):
                options.append(p.opts[0])
            continue
        if p is culprit:
            value = draw(st.sampled_from(bad_values(k, scratch)))
        elif p.required or draw(st.booleans()):
            value = draw(st.sampled_from(maybe_values(k, scratch) or ["x"]))
        else:
            continue
        if p.param_type_name == "argument":
            positional.append(value)
        else:
            options.extend([p.opts[0], value])
    extra = ["unexpected-extra-argument"] if culprit == EXTRA else []
    # Options first, `--` before positionals: a positional "-1" is a value, not an option.
    return [*command.path, *options, "--", *positional, *extra]


# -- running a case ------------------------------------------------------------------------


@dataclass
class Outcome:
    argv: list[str]
    exit_code: int
    seconds: float
    stdout: str
    stderr: str
    exception: BaseException | None

    def problems(self) -> list[str]:
        """What is wrong with how the command refused (empty: nothing)."""
        out = []
        if self.exit_code not in (1, 2):
            out.append(f"exit {self.exit_code}, not 1 or 2")
        if self.exception is not None and not isinstance(self.exception, SystemExit):
            out.append(f"raised {type(self.exception).__name__}: {self.exception}")
        lines = [x for x in self.stderr.splitlines() if x.strip()]
        if len(lines) > MAX_ERROR_LINES:
            out.append(f"{len(lines)} lines on stderr, at most {MAX_ERROR_LINES}")
        if "Traceback" in self.stdout + self.stderr:
            out.append("a traceback")
        if any(x.startswith("error: unexpected ") for x in lines):
            out.append("an exception nobody expected (the CLI's last line of defence)")
        if self.seconds > MAX_SECONDS:
            out.append(f"{self.seconds:.1f} s, at most {MAX_SECONDS:g}")
        return out

    def describe(self) -> str:
        shown = [a if len(a) < 60 else a[:20] + f"...({len(a)} chars)" for a in self.argv]
        return (
            f"sco {' '.join(map(repr, shown))}: {'; '.join(self.problems())}\n"
            f"stdout: {self.stdout[-600:]!r}\nstderr: {self.stderr[-600:]!r}"
        )


class StuckCommand(Exception):
    """A case still running at HARD_STOP_SECONDS."""


def _stuck(signum: int, frame: object) -> None:
    raise StuckCommand(f"still running after {HARD_STOP_SECONDS:g} s")


def run_case(args: list[str], env: dict[str, str], cwd: Path) -> Outcome:
    """`sco ARGS` in-process, in CWD (a relative path written lands there, not in the repo)."""
    runner = CliRunner()
    start = time.monotonic()
    here = Path.cwd()
    os.chdir(cwd)
    # A command that accepted its arguments and serves (a console, a relay) would run
    # forever in-process: a hard stop well past MAX_SECONDS turns it into a failed case
    # (the CliRunner records the exception) instead of a suite that hangs.
    previous = signal.signal(signal.SIGALRM, _stuck)
    signal.setitimer(signal.ITIMER_REAL, HARD_STOP_SECONDS)
    try:
        result = runner.invoke(app, args, env=env, catch_exceptions=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(here)
    return Outcome(
        argv=args,
        exit_code=result.exit_code,
        seconds=time.monotonic() - start,
        stdout=result.stdout,
        stderr=result.stderr,
        exception=result.exception,
    )


# -- the state a refused command must leave alone --------------------------------------------


@dataclass(frozen=True)
class State:
    fleet: dict[str, str]  # table -> digest of its rows
    temporal: dict[str, tuple[tuple[str, str, str, int], ...]]  # namespace -> workflows
    files: tuple[tuple[str, int], ...]  # (path, size) under the ledger and scratch dirs
    notes: list[str] = field(default_factory=list, compare=False)

    def diff(self, other: State) -> list[str]:
        out = []
        for table in sorted(set(self.fleet) | set(other.fleet)):
            if self.fleet.get(table) != other.fleet.get(table):
                out.append(f"fleet state table {table} changed")
        for ns in sorted(set(self.temporal) | set(other.temporal)):
            before, after = set(self.temporal.get(ns, ())), set(other.temporal.get(ns, ()))
            if before != after:
                out.append(f"Temporal {ns}: {sorted(before ^ after)}")
        if self.files != other.files:
            out.append(f"files: {sorted(set(self.files) ^ set(other.files))[:5]}")
        return out


#: Rows the box's own processes change while the fuzz runs (the worker's heartbeats and
#: leader locks are not what an operator's command may touch): left out of the digest.
_LIVE_TABLES = frozenset({"worker_heartbeats"})


def fleet_digest(dsn: str) -> dict[str, str]:
    out = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
            )
        ]
        for table in tables:
            if table in _LIVE_TABLES:
                continue
            rows = conn.execute(f'SELECT t::text FROM "{table}" t ORDER BY 1').fetchall()
            out[table] = hashlib.sha256("\n".join(r[0] for r in rows).encode()).hexdigest()
    return out


async def temporal_digest(
    address: str, prefix: str
) -> dict[str, tuple[tuple[str, str, str, int], ...]]:
    """Per namespace: each workflow's id, run, status, and how many signals and updates it
    received (a refused command sends none; the box's own timers do not count)."""
    from temporalio.api.enums.v1 import EventType

    counted = {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ADMITTED,
    }
    out = {}
    for region in REGIONS:
        ns = f"{prefix}{region}"
        client = await Client.connect(address, namespace=ns)
        rows = []
        async for wf in client.list_workflows():
            history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
            operator_events = sum(1 for e in history.events if e.event_type in counted)
            rows.append((wf.id, wf.run_id, wf.status.name if wf.status else "", operator_events))
        out[ns] = tuple(sorted(rows))
    return out


def file_listing(*dirs: Path) -> tuple[tuple[str, int], ...]:
    """Files under DIRS; in a chDB ledger (a `store/` inside) only its data parts: chDB
    writes its status and table metadata whenever a process (the worker) opens it."""
    out = []
    for d in dirs:
        ledger = d.name == "ledger"  # the box names its chDB directory so
        for root, _dirs, files in os.walk(d):
            for name in files:
                p = Path(root) / name
                if p.suffix in {".log", ".lock"} or "tmp" in p.parts[-2:]:
                    continue
                if ledger and not any(part.startswith("all_") for part in p.parts):
                    continue
                try:
                    out.append((str(p), p.stat().st_size))
                except OSError:
                    continue
    return tuple(sorted(out))


def snapshot(env: dict[str, str], *dirs: Path) -> State:
    return State(
        fleet=fleet_digest(env["SCO_POSTGRES_DSN"]),
        temporal=asyncio.run(
            temporal_digest(env["SCO_TEMPORAL__ADDRESS"], env["SCO_TEMPORAL__NAMESPACE_PREFIX"])
        ),
        files=file_listing(*dirs),
    )


def command_ids(cmds: list[Command]) -> Iterator[str]:
    for c in cmds:
        yield "-".join(c.path)
