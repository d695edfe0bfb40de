"""A real Ceph cluster with the RADOS Gateway for the suite, from Debian's packages.

tests/support/ceph/ceph-rgw-up.sh (the verified recipe from the shared reference: one
mon, one memstore OSD, radosgw, auth none, ~13 s) under a scratch directory, on ports of
its own so it never meets Temporal's 7233 or another cluster; stopped by the PIDs it
recorded. Skips with one line when the Ceph packages are missing (`make deps`).
"""

from __future__ import annotations

import random
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import tools
from tests.support.services import free_port

_SCRIPTS = Path(__file__).parent / "ceph"


@dataclass(frozen=True)
class RgwCluster:
    endpoint: str
    ceph_conf: Path
    directory: Path


def _ports_free(first: int, count: int) -> bool:
    for port in range(first, first + count):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


#: Where the blocks are sought: below Linux's ephemeral range (32768-60999), which every
#: outgoing connection and every `free_port()` of the other tests draws from (CI: no free
#: block between 41000 and 45900 with a three-region box and the test cloud running).
BLOCKS = range(20000, 26000 - 102, 102)  # below the box's runs (tests/support/services.py)


def _port_block() -> int:
    """A base port with itself, +1 (the monitor) and +2..+101 (daemons) free."""
    for base in random.sample(BLOCKS, len(BLOCKS)):
        if _ports_free(base, 102):
            return base
    raise RuntimeError(f"no free block of 102 ports between {BLOCKS.start} and {BLOCKS.stop}")


#: A monitor, an OSD and an RGW: ~40 s alone, over 120 s on a loaded 2-core CI machine.
START_TIMEOUT_S = 300


def start(directory: Path) -> RgwCluster:
    base, rgw_port = _port_block(), free_port()
    env = {
        "D": str(directory),
        "MGR": "0",
        "RGW_PORT": str(rgw_port),
        "MON_PORT": str(base),
        "PORT_MIN": str(base + 2),
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
    }
    cluster = RgwCluster(f"http://127.0.0.1:{rgw_port}", directory / "ceph.conf", directory)
    try:
        done = subprocess.run(
            ["bash", str(_SCRIPTS / "ceph-rgw-up.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        stop(cluster)  # the monitor, OSD and RGW it did start, not left to the next test
        why = f"Ceph RGW did not come up in {START_TIMEOUT_S} s in {directory}"
        raise RuntimeError(why) from exc
    if done.returncode != 0 or "ListAllMyBucketsResult" not in done.stdout:
        stop(cluster)
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"Ceph RGW did not come up in {directory}: {' | '.join(tail)}")
    return cluster


def stop(cluster: RgwCluster) -> None:
    subprocess.run(
        ["bash", str(_SCRIPTS / "ceph-rgw-down.sh")],
        env={"D": str(cluster.directory), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="session")
def rgw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RgwCluster]:
    tools.require(*tools.CEPH_RGW)
    cluster = start(tmp_path_factory.mktemp("ceph"))
    try:
        yield cluster
    finally:
        stop(cluster)
