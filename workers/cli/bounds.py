"""Every bound the operator's commands check, in one place, and the checks themselves.

A command checks what it was given before it writes, signals or starts anything; each
check is one line naming the argument and the reason (`fail`, exit 1). Bounds that depend
on the deployment come from the settings (the provider's API limit) or the contract
bundle (a contract's most units per region), never from a constant in a command.
"""

from __future__ import annotations

import math
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING

from workers.cli.common import fail

if TYPE_CHECKING:
    from contracts.model import Contract
    from workers.settings import Settings

#: Every call a command makes to Temporal (and its wait for the region's worker) ends
#: within this; below the 10 s an operator (and the CLI fuzz test) waits at most.
DEADLINE_SECONDS = 8.0
#: A NATS request (the notice relay's answer to a reclaim) and a NATS connect.
NATS_REQUEST_SECONDS = 8.0
NATS_CONNECT_SECONDS = 3.0
#: Free text an operator types (`--by`, `--reason`): recorded in the ledger and in
#: workflow histories, so bounded.
MAX_TEXT = 500
#: Names and ids (contracts, acquisitions, instances, hosts).
MAX_ID = 200
_ID_PUNCT = "._:@/-"


def text(name: str, value: str, *, max_len: int = MAX_TEXT) -> str:
    """VALUE stripped when it is printable, non-empty text of at most MAX_LEN characters."""
    stripped = value.strip()
    if not stripped:
        fail(f"{name}: empty")
    if len(stripped) > max_len:
        fail(f"{name}: {len(stripped)} characters, at most {max_len}")
    if any(unicodedata.category(ch) in {"Cc", "Cf", "Cs", "Co", "Cn"} for ch in stripped):
        fail(f"{name} {_shown(stripped)}: control or unassigned characters")
    return stripped


def identifier(name: str, value: str, *, max_len: int = MAX_ID) -> str:
    """VALUE when it is an id as SCO makes them: ASCII letters, digits and `._:@/-`."""
    stripped = text(name, value, max_len=max_len)
    if stripped != value or not all(_id_char(ch) for ch in value):
        fail(f"{name} {_shown(value)}: not an id (ASCII letters, digits and . _ : @ / - only)")
    return value


def _id_char(ch: str) -> bool:
    return ch.isascii() and (ch.isalnum() or ch in _ID_PUNCT)


def optional_text(name: str, value: str | None, *, max_len: int = MAX_TEXT) -> str | None:
    return None if value is None else text(name, value, max_len=max_len)


def optional_identifier(name: str, value: str | None) -> str | None:
    return None if value is None else identifier(name, value)


def finite(name: str, value: float, *, low: float, high: float, low_open: bool = False) -> float:
    """VALUE within [LOW, HIGH] (or (LOW, HIGH]), never NaN or infinite."""
    if not math.isfinite(value):
        fail(f"{name} {value}: not a finite number")
    if value < low or (low_open and value == low) or value > high:
        bracket = "(" if low_open else "["
        fail(f"{name} {value:g}: outside {bracket}{low:g}, {high:g}]")
    return value


def whole(name: str, value: int, *, low: int, high: int) -> int:
    if value < low or value > high:
        fail(f"{name} {value}: outside [{low}, {high}]")
    return value


def budget(s: Settings, rate: float, burst: int) -> tuple[float, int]:
    """A region's API token budget within the provider's configured limit
    (`provider.api_rate_limit_per_second`, `provider.api_burst_limit`): a typo cannot
    remove the guard against throttling the provider."""
    p = s.provider
    finite(
        "rate",
        rate,
        low=0,
        high=p.api_rate_limit_per_second,
        low_open=True,
    )
    whole("burst", burst, low=1, high=p.api_burst_limit)
    return rate, burst


def demand(contract: Contract, region: str, units: int) -> int:
    """Demand within what the contract allows per region (its `max_units_per_region`)."""
    cap = contract.placement.max_units_per_region
    if units < 0 or units > cap:
        fail(
            f"units {units}: contract {contract.name!r} allows 0 to {cap} units per region "
            f"in {region}; nothing stored"
        )
    return units


def hours(name: str, value: float | None, *, high: float = 24 * 365) -> float | None:
    return None if value is None else finite(name, value, low=0.01, high=high)


def _shown(value: str) -> str:
    short = value if len(value) <= 40 else value[:37] + "..."
    return ascii(short)


#: The longest path the CLI takes (Linux's PATH_MAX).
MAX_PATH = 4096


def path_value(value: str | Path) -> Path:
    """A path argument's parser (`typer.Option(..., parser=path_value)`): an empty or blank
    path would be `.` (the working directory), a control character or a path longer than
    PATH_MAX is never meant; each is a usage error naming the value."""
    import typer

    if isinstance(value, Path):  # a default, not what was typed
        return value
    if not value.strip():
        raise typer.BadParameter(f"{value!r}: empty path")
    if len(value) > MAX_PATH:
        raise typer.BadParameter(f"{len(value)} characters, at most {MAX_PATH}")
    if any(unicodedata.category(ch) == "Cc" for ch in value):
        raise typer.BadParameter(f"{_shown(value)}: control characters")
    return Path(value)


def out_dir(name: str, path: Path) -> Path:
    """PATH as a directory to write into: it is one, or its parent is (it is made then)."""
    if path.exists() and not path.is_dir():
        fail(f"{name} {_shown(str(path))}: not a directory")
    if not path.exists() and not path.parent.is_dir():
        fail(f"{name} {_shown(str(path))}: {_shown(str(path.parent))} is not a directory")
    return path


def out_file(name: str, path: Path) -> Path:
    """PATH as a file to write: not a directory, in a directory that exists."""
    if path.is_dir():
        fail(f"{name} {_shown(str(path))}: a directory, not a file")
    if not path.parent.is_dir():
        fail(f"{name} {_shown(str(path))}: {_shown(str(path.parent))} is not a directory")
    return path


def in_file(name: str, path: Path) -> Path:
    if not path.is_file():
        fail(f"{name} {_shown(str(path))}: no such file")
    return path


def in_dir(name: str, path: Path) -> Path:
    if not path.is_dir():
        fail(f"{name} {_shown(str(path))}: no such directory")
    return path
