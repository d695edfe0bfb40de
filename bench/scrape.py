"""One figure from a running process's Prometheus endpoint, as a bench reads it."""

from __future__ import annotations

import urllib.request


def metric(port: int, name: str) -> float | None:
    """The sum of `name`'s samples (every label set) on 127.0.0.1:`port`/metrics; None when
    the process does not answer."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    except OSError:
        return None
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total
