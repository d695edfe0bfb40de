"""CPU time and memory of processes by pid, from /proc (no psutil here): what a bench
samples per step for the worker, the Temporal dev server, PostgreSQL backends, agents;
what `sco dev status` shows per process of the box; the ledger consumer's own RSS."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of `pid` in seconds; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon and RssFile of `pid` in MB; empty when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    out: dict[str, float] = {}
    for line in status.splitlines():
        key = line.split(":")[0]
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(line.split()[1]) / 1024
    return out


def rss_mb(pid: int) -> float | None:
    return memory_mb(pid).get("VmRSS")


def _processes() -> list[tuple[int, int, str]]:
    """(pid, parent pid, command name) of every process: one pass over /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        found.append((int(entry.name), ppid, name))
    return found


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of the processes whose parent is `pid`."""
    return [(p, name) for p, ppid, name in _processes() if ppid == pid]


def children_by_parent() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc: for `tree_rss_mb` over many."""
    kids: dict[int, list[int]] = {}
    for p, ppid, _ in _processes():
        kids.setdefault(ppid, []).append(p)
    return kids


def tree_rss_mb(pid: int, kids: Mapping[int, list[int]] | None = None) -> float | None:
    """VmRSS of `pid` and its descendants, MB (a server started through a wrapper, the
    worker's ledger child, count whole); None when `pid` is gone. `kids`
    (`children_by_parent()`) lets several trees share one pass over /proc."""
    own = rss_mb(pid)
    if own is None:
        return None
    kids = children_by_parent() if kids is None else kids
    return own + sum(tree_rss_mb(child, kids) or 0.0 for child in kids.get(pid, ()))


def total_cpu(pids: list[int]) -> float:
    return sum(c for p in pids if (c := cpu_seconds(p)) is not None)


def cpu_delta(before: dict[int, float], pids: list[int]) -> float:
    """CPU seconds used since `before` (pid -> cpu seconds) by `pids`; a pid that is new
    counts whole, one that is gone counts nothing past `before`."""
    used = 0.0
    for p in pids:
        now = cpu_seconds(p)
        if now is not None:
            used += now - before.get(p, 0.0)
    return used


def snapshot(pids: list[int]) -> dict[int, float]:
    return {p: c for p in pids if (c := cpu_seconds(p)) is not None}
