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

With `--bao-path` the checkpoints go to Ceph RGW instead, under the contract's bucket and
prefix, with the contract's keys read from OpenBao (`sco checkpoints provision
--openbao-region`) with the tenant's own token; `--store` then names the job's directory
under the prefix. S3 is spoken with AWS signature v2 (RGW accepts it): standard library only,
as a node's python3 has no boto3.
"""

from __future__ import annotations

import argparse
import base64
import email.utils
import hashlib
import hmac
import json
import os
import re
import ssl
import time
import urllib.parse
import urllib.request
from pathlib import Path


def _write(path: Path, doc: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


class DirStore:
    """Checkpoints as files in a directory shared by the nodes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def latest(self) -> int | None:
        steps = [int(p.stem.removeprefix("step-")) for p in self.root.glob("step-*.json")]
        return max(steps) if steps else None

    def load(self, step: int) -> int:
        return int(json.loads((self.root / f"step-{step}.json").read_text())["step"])

    def save(self, step: int) -> str:
        path = self.root / f"step-{step}.json"
        _write(path, {"step": step})
        return str(path)


class S3Store:
    """Checkpoints as objects in the contract's bucket on RGW, its keys from OpenBao."""

    def __init__(self, bao: str, ca: Path, token_file: Path, path: str, job: str) -> None:
        request = urllib.request.Request(
            f"{bao}/v1/{path}", headers={"X-Vault-Token": token_file.read_text().strip()}
        )
        context = ssl.create_default_context(cafile=str(ca))
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            secret = json.load(reply)["data"]["data"]
        self.endpoint, self.bucket = secret["endpoint"].rstrip("/"), secret["bucket"]
        self.access, self.secret = secret["access_key"], secret["secret_key"]
        self.base = "/".join(p for p in (secret["prefix"], job) if p)

    def _call(self, method: str, key: str, body: bytes | None = None, query: str = "") -> bytes:
        date = email.utils.formatdate(usegmt=True)
        ctype = "application/json" if body is not None else ""
        resource = f"/{self.bucket}/{urllib.parse.quote(key)}"
        to_sign = f"{method}\n\n{ctype}\n{date}\n{resource}"
        mac = hmac.new(self.secret.encode(), to_sign.encode(), hashlib.sha1).digest()
        headers = {
            "Date": date,
            "Authorization": f"AWS {self.access}:{base64.b64encode(mac).decode()}",
        }
        if ctype:
            headers["Content-Type"] = ctype
        url = f"{self.endpoint}{resource}" + (f"?{query}" if query else "")
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=10) as reply:
            return bytes(reply.read())

    # The layout of agent/checkpoint/s3_store.py: `<job>/step-<N>/` with `COMPLETE` written
    # last, so `sco checkpoints list` sees the job's steps and a half-written one is skipped.
    def latest(self) -> int | None:
        listing = self._call("GET", "", query=urllib.parse.urlencode({"prefix": f"{self.base}/"}))
        done = re.findall(rb"<Key>[^<]*/step-(\d+)/COMPLETE</Key>", listing)
        return max(int(k) for k in done) if done else None

    def load(self, step: int) -> int:
        return int(json.loads(self._call("GET", f"{self.base}/step-{step}/state.json"))["step"])

    def save(self, step: int) -> str:
        where = f"{self.base}/step-{step}"
        self._call("PUT", f"{where}/state.json", json.dumps({"step": step}).encode())
        self._call("PUT", f"{where}/COMPLETE", b"")
        return f"s3://{self.bucket}/{where}"


def main() -> int:
    from agent.checkpoint.server import register

    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", type=Path, required=True)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--status", type=Path, required=True)
    ap.add_argument("--bao", help="OpenBao's address: checkpoints on RGW with its keys")
    ap.add_argument("--bao-ca", type=Path)
    ap.add_argument("--bao-token-file", type=Path)
    ap.add_argument("--bao-path", help="the contract's secret (sco/data/<r>/checkpoints/<c>)")
    a = ap.parse_args()
    store: DirStore | S3Store
    if a.bao_path:
        store = S3Store(a.bao, a.bao_ca, a.bao_token_file, a.bao_path, str(a.store))
    else:
        store = DirStore(a.store)
    resumed = store.latest()
    step = store.load(resumed) if resumed is not None else 0
    status: dict[str, object] = {"uid": os.getuid(), "resumed_from": resumed, "step": step}

    def checkpoint(_reason: str, _deadline: float) -> str:
        at = step  # read once: the loop may take the step it was in after `draining`
        path = store.save(at)
        status["saved"] = at
        _write(a.status, status)
        return path

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
