"""A training-like workload for the node containers (tests/deploy/test_region_as_shipped.py):
run on a node, as its own unprivileged user, with the agent's checkpoint library from the
installed package (`PYTHONPATH=/usr/lib/sco-agent`). Standard library only.

It resumes from the newest checkpoint under `--store` (when there is one), then takes one
step every 20 ms until the agent's drain asks for a checkpoint: it saves the step it is at
under `--store` (write, then rename: a reader never sees half of one), answers with the
path and exits. `--status` (JSON, rewritten on every change) says what it did: its uid,
where it resumed from, the step it saved.

    python3 node_workload.py --socket /run/sco-agent/checkpoint/job-1/sock \
        --store /ckpt/job-1 --status /ckpt/job-1.status.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _write(path: Path, doc: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def _latest(store: Path) -> int | None:
    steps = [int(p.stem.removeprefix("step-")) for p in store.glob("step-*.json")]
    return max(steps) if steps else None


def main() -> int:
    from agent.checkpoint.server import register

    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", type=Path, required=True)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--status", type=Path, required=True)
    a = ap.parse_args()
    a.store.mkdir(parents=True, exist_ok=True)
    resumed = _latest(a.store)
    if resumed is not None:
        step = int(json.loads((a.store / f"step-{resumed}.json").read_text())["step"])
    else:
        step = 0
    status: dict[str, object] = {"uid": os.getuid(), "resumed_from": resumed, "step": step}

    def checkpoint(_reason: str, _deadline: float) -> str:
        at = step  # read once: the loop may take the step it was in after `draining`
        path = a.store / f"step-{at}.json"
        _write(path, {"step": at})
        status["saved"] = at
        _write(a.status, status)
        return str(path)

    server = register(checkpoint, socket_path=a.socket)
    server.listening.wait(60)
    status["listening"] = server.listening.is_set()
    _write(a.status, status)
    while not server.draining.is_set():
        # sleep is the behaviour under test: the workload's own work, one step per 20 ms.
        time.sleep(0.02)
        step += 1
        if step % 25 == 0:
            status["step"] = step
            _write(a.status, status)
    server.answered.wait(60)
    server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
