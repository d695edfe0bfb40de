"""Keeping long-running processes light: what a process must not import for nothing.

nats-py imports aiohttp (and multidict) in `nats.aio.transport` only for its WebSocket
transport (`ws://` URLs); SCO connects with `nats://` and `tls://` only. aiohttp costs
about 20 MB of resident memory in every process that talks NATS (the node agent, the
notice relays, the drain intake, the simulator). :func:`no_websockets_for_nats`, called
first thing by a process's entry (`python -m agent`, `sco`), makes that one import fail,
so nats takes its own no-aiohttp path; any other importer still gets aiohttp. A `ws://`
NATS URL then fails to connect with nats-py's "Could not import aiohttp transport".

Here, not in `workers/`, because the node agent uses it and imports nothing of the
control plane; it imports nothing itself beyond the standard library.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

_SKIPPED = frozenset({"aiohttp", "multidict"})
_IMPORTER = "nats.aio.transport"


class _NoWebSocketsForNats(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in _SKIPPED and _imported_from(_IMPORTER):
            raise ModuleNotFoundError(f"{fullname}: not for {_IMPORTER}", name=fullname)
        return None  # everything else: the next finder's


def _imported_from(module: str, depth: int = 40) -> bool:
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame.f_globals.get("__name__") == module:
            return True
        if frame.f_back is None:
            return False
        frame = frame.f_back
    return False


def no_websockets_for_nats() -> None:
    """Install the finder (idempotent). Does nothing for a process that has imported
    nats already: call it before anything imports nats."""
    if not any(isinstance(f, _NoWebSocketsForNats) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoWebSocketsForNats())
