"""`make deps`: install what tests/support/tools.py lists and is not here yet.

Idempotent and quick when everything is present (it only looks on PATH and in the venv).
Debian packages go through apt-get when we are root; the torch wheel into this venv with
pip. Whatever cannot be installed (not root, no apt, the wheel not found) is reported once:
the tool, the command that installs it and the tests that skip without it. That is not a
failure, unless SCO_REQUIRE_TOOLS=1 (CI), where every test must run.

    .venv/bin/python -m tests.support.install_tools
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys

from tests.support.tools import Tool, install_command, missing


def _run(argv: list[str]) -> bool:
    print(f"make deps: {' '.join(argv)}", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(argv, env=env, check=False).returncode == 0


def install(tools: list[Tool]) -> None:
    apt = [t.requirement for t in tools if t.via == "apt"]
    as_root = os.geteuid() == 0 and shutil.which("apt-get") is not None
    if apt and as_root and _run(["apt-get", "update", "-q"]):
        _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *apt])
    pip = [t.requirement for t in tools if t.via == "pip"]
    if pip:
        _run([sys.executable, "-m", "pip", "install", "--quiet", *pip])
        importlib.invalidate_caches()  # find_spec must see what pip just installed


def report(tools: list[Tool]) -> str:
    lines = ["make deps: these tools are missing; their tests will skip:"]
    by_tests: dict[str, list[str]] = {}
    for tool in tools:
        by_tests.setdefault(tool.tests, []).append(tool.name)
    lines += [f"  {', '.join(names)}: {tests}" for tests, names in by_tests.items()]
    if any(t.via == "apt" for t in tools) and os.geteuid() != 0:
        lines.append("  (not root: apt-get was not run)")
    lines.append(f"install them with: {install_command(tools)}")
    return "\n".join(lines)


def main() -> int:
    if not (gone := missing()):
        return 0
    install(gone)
    if not (still := missing()):
        return 0
    print(report(still), file=sys.stderr)
    return 1 if os.environ.get("SCO_REQUIRE_TOOLS") == "1" else 0


if __name__ == "__main__":
    sys.exit(main())
