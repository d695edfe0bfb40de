"""Slurm hostlists (`r1-a-gp-m-[001-003,007],login1`), expanded without calling scontrol.

Pure code: the ResumeProgram expands its argument on every call and should not pay for a
process per call.
"""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class HostlistError(ValueError):
    pass


def expand(hostlist: str) -> list[str]:
    """Every host of `hostlist`, in order, without duplicates."""
    out: list[str] = []
    seen: set[str] = set()
    for part in _split_top(hostlist.strip()):
        for host in _expand_one(part):
            if host not in seen:
                seen.add(host)
                out.append(host)
    return out


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts: list[str] = []
    depth = start = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"unbalanced '[' in hostlist {text!r}")
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]


def _expand_one(part: str) -> list[str]:
    open_at = part.find("[")
    if open_at < 0:
        return [part]
    close_at = part.index("]", open_at)
    prefix, body, rest = part[:open_at], part[open_at + 1 : close_at], part[close_at + 1 :]
    tails = _expand_one(rest) if rest else [""]
    out: list[str] = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise HostlistError(f"bad range {item!r} in hostlist {part!r}")
        lo, hi = match[1], match[2] or match[1]
        if int(hi) < int(lo):
            raise HostlistError(f"range {item!r} runs backwards in hostlist {part!r}")
        width = len(lo) if lo.startswith("0") else 0
        for n in range(int(lo), int(hi) + 1):
            out.extend(f"{prefix}{n:0{width}d}{tail}" for tail in tails)
    return out


def ranged(prefix: str, count: int, *, width: int = 3, start: int = 1) -> str:
    """`prefix[001-010]`: the hostlist of `count` numbered nodes."""
    if count < 1:
        raise HostlistError("a node range needs at least one node")
    lo, hi = start, start + count - 1
    if count == 1:
        return f"{prefix}{lo:0{width}d}"
    return f"{prefix}[{lo:0{width}d}-{hi:0{width}d}]"
