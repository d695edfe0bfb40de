"""Keeping long-running processes light: what a process must not import for nothing.

nats-py imports aiohttp (and multidict) in `nats.aio.transport` only for its WebSocket
transport (`ws://` URLs); SCO connects with `nats://` and `tls://` only. aiohttp costs
about 20 MB of resident memory in every process that talks NATS (the node agent, the
notice relays, the drain intake, the simulator). :func:`no_websockets_for_nats`, called
first thing by a process's entry (`python -m agent`, `sco`), makes that one import fail,
so nats takes its own no-aiohttp path; any other importer still gets aiohttp. A `ws://`
NATS URL then fails to connect with nats-py's "Could not import aiohttp transport".

Two more imports that cost every process memory for nothing (issue 33, decision 0026),
both of `importlib.metadata` (with email, zipfile, csv, calendar: ~1 MB resident):
- nats-py reads its own version with `importlib.metadata.version("nats-py")` to send in
  CONNECT; the finder answers that one import with ModuleNotFoundError (nats then takes
  its "0.0.0" branch) and sets the client module's `__version__` from the name of the
  package's `.dist-info` directory instead, so the server sees the same version;
- pydantic loads plugins through entry points (`pydantic.plugin._loader`, which imports
  importlib.metadata and scans every installed distribution) when it builds the first
  model; SCO uses no pydantic plugin, so that module is served as one whose
  `get_plugins()` returns none, as `PYDANTIC_DISABLE_PLUGINS=__all__` would make it.
A process that imports importlib.metadata itself still gets it.

Here, not in `workers/`, because the node agent uses it and imports nothing of the
control plane; it imports nothing itself beyond the standard library (and not
importlib.abc: that would load importlib.resources, tempfile and shutil for nothing).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType

_SKIPPED = frozenset({"aiohttp", "multidict"})
_IMPORTER = "nats.aio.transport"
_NATS_CLIENT = "nats.aio.client"
_PYDANTIC_PLUGINS = "pydantic.plugin._loader"
#: Version modules that are only `from importlib import metadata; __version__ =
#: metadata.version(<dist>)` -> the dist-info name's prefix (psycopg compares its C
#: module's version with its own: each must be the installed one, as it is here).
_VERSION_MODULES = {
    "psycopg.version": "psycopg",
    "psycopg_binary.version": "psycopg_binary",
    "psycopg_pool.version": "psycopg_pool",
}


class _NoPluginsLoader:
    """`pydantic.plugin._loader` without entry points: no plugins, nothing scanned."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        def get_plugins() -> tuple[()]:
            return ()

        module.get_plugins = get_plugins  # type: ignore[attr-defined]


class _NatsVersionLoader:
    """nats-py's client module as it is, with its version read from its dist-info."""

    def __init__(self, inner: importlib.machinery.SourceFileLoader, origin: str) -> None:
        self.inner, self.origin = inner, origin

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        if getattr(module, "__version__", None) == "0.0.0":
            version = _dist_version(self.origin, "nats_py") or "0.0.0"
            module.__version__ = version  # type: ignore[attr-defined]


def _dist_version(origin: str, dist: str, levels: int = 2) -> str | None:
    """The version in `<dist>-<version>.dist-info` in the directory `levels` packages
    above the module file `origin` (nats/aio/client.py: 2)."""
    site = os.path.dirname(origin)
    for _ in range(levels):
        site = os.path.dirname(site)
    prefix = f"{dist}-"
    try:
        names = os.listdir(site)
    except OSError:
        return None
    for name in names:
        if name.startswith(prefix) and name.endswith(".dist-info"):
            return name[len(prefix) : -len(".dist-info")]
    return None


class _DistVersionLoader:
    """A distribution's `version` module that is only `__version__ = version(dist)`,
    served with the version read from the dist-info directory's name."""

    def __init__(self, origin: str, dist: str, levels: int) -> None:
        self.origin, self.dist, self.levels = origin, dist, levels

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__version__ = _dist_version(self.origin, self.dist, self.levels) or "0.0.0.0"  # type: ignore[attr-defined]


class _LeanImports:
    """A meta path finder (no importlib.abc base: see the module's docstring)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in _SKIPPED and _imported_from(_IMPORTER):
            raise ModuleNotFoundError(f"{fullname}: not for {_IMPORTER}", name=fullname)
        if fullname == "importlib.metadata" and _imported_from(_NATS_CLIENT, depth=8):
            raise ModuleNotFoundError(f"{fullname}: not for {_NATS_CLIENT}", name=fullname)
        if fullname == _PYDANTIC_PLUGINS:
            return importlib.machinery.ModuleSpec(fullname, _NoPluginsLoader())  # type: ignore[arg-type]
        if (dist := _VERSION_MODULES.get(fullname)) is not None:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and spec.origin:
                spec.loader = _DistVersionLoader(spec.origin, dist, 1)  # type: ignore[assignment]
            return spec
        if fullname == _NATS_CLIENT:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if (
                spec is not None
                and spec.origin
                and isinstance(spec.loader, importlib.machinery.SourceFileLoader)
            ):
                spec.loader = _NatsVersionLoader(spec.loader, spec.origin)  # type: ignore[assignment]
            return spec
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
    nats (or pydantic's plugin loader) already: call it before anything imports them."""
    if not any(isinstance(f, _LeanImports) for f in sys.meta_path):
        sys.meta_path.insert(0, _LeanImports())
