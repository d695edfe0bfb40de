"""Provision checkpoint storage per contract on Ceph RGW, from the signed bundle.

Each contract whose drain checkpoints to `s3://BUCKET/...` gets its own RGW user
(`sco-ckpt-<contract>`, made with `radosgw-admin`, which talks to the cluster through its
ceph.conf) and its own bucket, created with that user's keys so the user owns it and no
other contract's keys can read it (private ACL, RGW's default). A lifecycle rule expires
checkpoints after `keep_days`. Everything is idempotent: an existing user keeps its keys,
an existing bucket owned by it is kept, the rule is put again.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import ClientError

from contracts.model import Contract

#: The object agent.checkpoint.s3_store writes last in a step; without it the step is partial.
MARKER = "COMPLETE"
_STEP_IN_KEY = re.compile(r"^(.*?)/step-(\d+)/")


class ProvisionError(RuntimeError):
    """RGW refused or could not be reached; the message names the contract and why."""


@dataclass(frozen=True)
class Credentials:
    contract: str
    user: str
    access_key: str
    secret_key: str
    bucket: str
    prefix: str
    endpoint: str

    def s3(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="default",
        )

    def env(self) -> dict[str, str]:
        """What a workload of this contract needs in its environment (boto3's chain)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "default",
        }


@dataclass(frozen=True)
class StoredCheckpoint:
    run: str  # the path between the contract's prefix and `step-N/` ("" when none)
    step: int
    complete: bool
    objects: int
    bytes: int
    last_modified: datetime


def s3_target(contract: Contract) -> tuple[str, str] | None:
    """(bucket, prefix) of the contract's s3:// checkpoint URI; None when it has none."""
    uri = contract.drain.checkpoint_uri
    if uri is None or not uri.startswith("s3://"):
        return None
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


def user_id(contract: str) -> str:
    return f"sco-ckpt-{contract}"


class Rgw:
    def __init__(self, endpoint: str, ceph_conf: Path, *, admin: str = "radosgw-admin") -> None:
        self.endpoint = endpoint
        self._conf = ceph_conf
        self._admin = admin

    def _radosgw_admin(self, *args: str) -> tuple[int, dict[str, Any]]:
        argv = [self._admin, "-c", str(self._conf), *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ProvisionError(f"{self._admin}: {exc}") from exc
        try:
            doc = json.loads(done.stdout) if done.stdout.strip() else {}
        except json.JSONDecodeError:
            doc = {}
        if done.returncode != 0 and not doc:
            doc = {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
        return done.returncode, doc

    def user(self, contract: Contract) -> tuple[str, str]:
        """The contract's RGW user's (access, secret) key, creating the user once."""
        uid = user_id(contract.name)
        rc, doc = self._radosgw_admin("user", "info", f"--uid={uid}")
        if rc != 0:
            rc, doc = self._radosgw_admin(
                "user", "create", f"--uid={uid}", f"--display-name=SCO checkpoints {contract.name}"
            )
            if rc != 0:
                raise ProvisionError(f"{contract.name}: user {uid}: {doc.get('error')}")
        keys = doc.get("keys") or []
        if not keys:
            raise ProvisionError(f"{contract.name}: user {uid} has no S3 keys")
        return str(keys[0]["access_key"]), str(keys[0]["secret_key"])

    def provision(self, contract: Contract, keep_days: int) -> Credentials:
        target = s3_target(contract)
        if target is None:
            raise ProvisionError(f"{contract.name}: drain.checkpoint_uri is not s3://")
        bucket, prefix = target
        access, secret = self.user(contract)
        creds = Credentials(
            contract.name, user_id(contract.name), access, secret, bucket, prefix, self.endpoint
        )
        s3 = creds.s3()
        try:
            s3.create_bucket(Bucket=bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code != "BucketAlreadyOwnedByYou":
                raise ProvisionError(f"{contract.name}: bucket {bucket}: {code or exc}") from exc
        rule = {
            "ID": "sco-expire-checkpoints",
            "Status": "Enabled",
            "Filter": {"Prefix": f"{prefix}/" if prefix else ""},
            "Expiration": {"Days": keep_days},
        }
        try:
            s3.put_bucket_lifecycle_configuration(
                Bucket=bucket, LifecycleConfiguration={"Rules": [rule]}
            )
        except ClientError as exc:
            raise ProvisionError(f"{contract.name}: lifecycle on {bucket}: {exc}") from exc
        return creds


def provision_all(rgw: Rgw, contracts: Sequence[Contract], keep_days: int) -> list[Credentials]:
    """Every contract with an s3:// checkpoint target; two naming one bucket is refused."""
    owners: dict[str, str] = {}
    wanted = []
    for contract in contracts:
        if (target := s3_target(contract)) is None:
            continue
        if (other := owners.setdefault(target[0], contract.name)) != contract.name:
            raise ProvisionError(
                f"{contract.name}: bucket {target[0]} is already {other}'s checkpoint bucket"
            )
        wanted.append(contract)
    return [rgw.provision(c, keep_days) for c in wanted]


def write_credentials(directory: Path, creds: Credentials) -> Path:
    """`<dir>/<contract>.json`, readable by its owner only (it holds the secret key)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{creds.contract}.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(creds.__dict__, fh, indent=2, sort_keys=True)
    return path


def read_credentials(directory: Path, contract: str) -> Credentials:
    path = directory / f"{contract}.json"
    try:
        return Credentials(**json.loads(path.read_text()))
    except OSError as exc:
        raise ProvisionError(f"{path}: {exc.strerror} (run sco checkpoints provision)") from exc
    except (json.JSONDecodeError, TypeError) as exc:
        raise ProvisionError(f"{path}: not a credentials file: {exc}") from exc


def stored(creds: Credentials) -> list[StoredCheckpoint]:
    """What the contract's bucket holds, per step, read with the contract's own keys."""
    s3 = creds.s3()
    base = f"{creds.prefix}/" if creds.prefix else ""
    per: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=creds.bucket, Prefix=base):
        for obj in page.get("Contents", []):
            if match := _STEP_IN_KEY.search("/" + str(obj["Key"]).removeprefix(base)):
                per.setdefault((match[1].strip("/"), int(match[2])), []).append(obj)
    return [
        StoredCheckpoint(
            run,
            step,
            any(str(o["Key"]).endswith(f"/{MARKER}") for o in objs),
            len(objs),
            sum(int(o["Size"]) for o in objs),
            max(o["LastModified"] for o in objs),
        )
        for (run, step), objs in sorted(per.items())
    ]
