"""The processes of the checkpoint trust tests, each run as its own user by the test.

    python -m tests.support.checkpoint_roles '<spec JSON>'

Roles (spec["role"]):
    sync      the agent's pass over the node's jobs: jobdirs.sync(socket_dir, {name: uid})
    drain     the agent's drain engine over spec["workloads"] (llm-train jobs: checkpoint)
    serve     a workload: agent.checkpoint.register at its default socket path (from the
              environment the test gives it), answering after spec["delay"] seconds
    serve_raw an impostor: binds spec["path"] and answers every connection spec["reply"]
    attack    a tenant: connects to spec["path"] and asks for a checkpoint
    mkdir     a tenant: tries to make spec["path"]

Each prints JSON lines on stdout: what it did, and for the servers what they were asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agent.checkpoint import jobdirs, register
from agent.checkpoint.protocol import Request, Saved
from agent.drain import DrainEngine
from agent.notices import Notice
from agent.scheduler import Workload
from contracts.bundle import BundleContent
from contracts.node_bundle import NodeBundle
from contracts.source import read_contracts
from tests.support.agent_fakes import RecordingScheduler
from tests.support.paths import EXAMPLES


def say(**doc: Any) -> None:
    print(json.dumps(doc), flush=True)


def training_bundle() -> NodeBundle:
    sources, findings = read_contracts(EXAMPLES)
    assert not findings
    return BundleContent(
        serial=1,
        created_at=datetime.now(UTC),
        regions=["r1"],
        contracts=[s.contract for s in sources],
    ).as_node()


def training_job(job: str, socket_name: str, **owner: Any) -> Workload:
    """A job of the llm-train contract (drain action: checkpoint)."""
    return Workload(
        id=job,
        socket_name=socket_name,
        account="mlr",
        partition="spot",
        comment="sco-contract=llm-train",
        **owner,
    )


async def drain(spec: dict[str, Any]) -> None:
    workloads = [training_job(**w) for w in spec["workloads"]]
    scheduler = RecordingScheduler(list(workloads))
    engine = DrainEngine(
        scheduler, Path(spec["socket_dir"]), dry_run=False, safety_margin_seconds=0.0
    )
    deadline = datetime.now(UTC) + timedelta(seconds=float(spec["bound"]))
    started = time.monotonic()
    report = await engine.drain(
        Notice("trust", "n1", deadline, "reclaim", "test"), training_bundle(), 1
    )
    say(
        took=time.monotonic() - started,
        ops=scheduler.ops(),
        outcomes={
            w.workload: {
                "result": w.result,
                "detail": w.detail,
                "path": w.path,
                "lost_steps": w.lost_steps,
            }
            for w in report.workloads
        },
    )


def serve(spec: dict[str, Any]) -> None:
    def checkpoint_now(reason: str, deadline: float) -> Saved:
        say(called=reason)
        # sleep is the behaviour under test: a save that takes spec["delay"] seconds
        time.sleep(float(spec.get("delay", 0)))
        return Saved(f"file:///ckpt/{os.getuid()}", lost_steps=3)

    server = register(checkpoint_now)
    if not server.listening.wait(float(spec.get("listen_within", 30))):
        say(error=f"never listening on {server.path}")
        return
    say(listening=str(server.path))
    while not server.answered.wait(0.2):
        pass
    say(answered=server.answered_path, refused=server.refused)


def serve_raw(spec: dict[str, Any]) -> None:
    path = Path(spec["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o666)
    sock.listen(4)
    say(listening=str(path))
    while True:
        conn, _ = sock.accept()
        with conn:
            conn.settimeout(5)
            say(asked=conn.recv(4096).decode(errors="replace"))
            conn.sendall(spec["reply"].encode())


def attack(spec: dict[str, Any]) -> None:
    request = Request("checkpoint", "evil", time.time() + 30).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(spec["path"])
            # Refused before it read anything: its answer is still there to read.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(request)
            say(reply=sock.recv(4096).decode(errors="replace"))
    except OSError as exc:
        say(error=type(exc).__name__, detail=str(exc))


def mkdir(spec: dict[str, Any]) -> None:
    try:
        os.mkdir(spec["path"])
        say(made=spec["path"])
    except OSError as exc:
        say(error=type(exc).__name__, detail=str(exc))


def main() -> None:
    spec = json.loads(sys.argv[1])
    role = spec["role"]
    if role == "sync":
        result = jobdirs.sync(Path(spec["socket_dir"]), spec["wanted"])
        say(made=result.made, removed=result.removed, failed=result.failed)
    elif role == "drain":
        asyncio.run(drain(spec))
    elif role == "serve":
        serve(spec)
    elif role == "serve_raw":
        serve_raw(spec)
    elif role == "attack":
        attack(spec)
    elif role == "mkdir":
        mkdir(spec)
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
