"""What each benchmark needs from the machine beyond the Python environment, as the reason
it cannot run (None: it can). bench/run_all.py records the reason as "not run"; the tiny
bench test skips with it."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue")


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def postgres() -> str | None:
    return None if _listening("127.0.0.1", 5432) else "PostgreSQL not listening on :5432"


def nats() -> str | None:
    return None if _listening("127.0.0.1", 4222) else "NATS not listening on :4222"


def secure_box() -> str | None:
    """The secure box: the machine's PostgreSQL server binaries (with SSL) and nginx."""
    from workers.devbox import tls_servers

    if tls_servers.postgres_bin_dir() is None:
        return "PostgreSQL server binaries missing: apt-get install -y postgresql"
    if shutil.which("nginx") is None:
        return "nginx missing: apt-get install -y nginx"
    return postgres()


def suite_run() -> str | None:
    """The suite bench reads the last `make test`'s JUnit XML."""
    if (REPO / ".sco" / "test-results.xml").is_file():
        return None
    return ".sco/test-results.xml missing: run `make test` first"


def slurm() -> str | None:
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None]
    if missing:
        return f"{', '.join(missing)} missing: apt-get install -y slurmd slurmctld munge"
    return postgres()


#: Where `make testcloud-up` writes the test cloud's clouds.yaml (relative to the repo).
TESTCLOUD_CLOUDS = ".sco/testcloud/clouds.yaml"


def testcloud_config() -> str:
    """The clouds.yaml a test-cloud bench uses: OS_CLIENT_CONFIG_FILE, else the test cloud's."""
    return os.environ.get("OS_CLIENT_CONFIG_FILE") or str(REPO / TESTCLOUD_CLOUDS)


def testcloud() -> str | None:
    config = testcloud_config()
    if not (REPO / config).is_file():
        return f"no OpenStack test cloud ({config} missing: make testcloud-up)"
    return None


def first(*checks: Callable[[], str | None]) -> Callable[[], str | None]:
    def check() -> str | None:
        return next((r for c in checks if (r := c()) is not None), None)

    return check
