"""`systemd-analyze verify` of a unit inside a scratch root: the unit and .deb tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def systemd_verify(unit: Path, root: Path) -> str:
    """`systemd-analyze verify` of `unit` inside `root` (so ExecStart= is looked up
    there; systemd's own units come from this machine); its complaints, "" when clean."""
    system = root / "usr" / "lib" / "systemd" / "system"
    if not system.exists():  # a copy (~1 MB): a symlink would resolve inside `root`
        shutil.copytree("/lib/systemd/system", system, symlinks=True)
    out = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", f"--root={root}", str(unit)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    status = f"\nexit {out.returncode}" if out.returncode else ""
    return (out.stdout + out.stderr).strip() + status
