"""Text helpers of the CLI that load nothing: a long-running process started without the
CLI's machinery (workers/cli/notice_relay.py) words its errors as the commands do."""

from __future__ import annotations


def shown(value: str) -> str:
    """VALUE in a message: as typed when it is a plain word, quoted when it is empty, has
    spaces or invisible characters, and shortened when long."""
    short = value if len(value) <= 60 else value[:57] + "..."
    plain = short and short.isprintable() and not any(ch.isspace() for ch in short)
    return short if plain and short.isascii() else ascii(short)
