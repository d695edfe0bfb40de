"""DCP checkpoints in an S3 bucket (Ceph RGW): staged on local disk, uploaded, marked.

A save writes the DCP files to a local staging directory, uploads each under
`<prefix>/step-<N>/`, and writes `<prefix>/step-<N>/COMPLETE` last, and only when every
file is up. A save cut off by its deadline (or by the process dying) leaves no marker, so
`latest` never takes it for a complete checkpoint; the contract's lifecycle rule expires
such leftovers with the old checkpoints. Credentials and endpoint come from boto3's usual
chain (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL: the contract's own
RGW user, provisioned by `sco checkpoints provision`). boto3 is imported only when used.
"""

from __future__ import annotations

import importlib
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER = "COMPLETE"
_STEP_KEY = re.compile(r"step-(\d+)/")


class DeadlineExceeded(TimeoutError):
    """The upload did not finish before the drain's deadline; no marker was written."""


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # without a trailing slash; may be ""

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        if not uri.startswith("s3://"):
            raise ValueError(f"{uri}: not an s3:// URI")
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if not bucket:
            raise ValueError(f"{uri}: no bucket")
        return cls(bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def uri(self, *parts: str) -> str:
        return f"s3://{self.bucket}/{self.key(*parts)}"


def client() -> Any:
    return importlib.import_module("boto3").client("s3")


def steps(s3: Any, where: S3Location) -> dict[int, bool]:
    """Every step stored under `where` and whether its marker is there."""
    found: dict[int, bool] = {}
    base = where.key() + "/" if where.prefix else ""
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=base):
        for obj in page.get("Contents", []):
            rest = str(obj["Key"]).removeprefix(base)
            if match := _STEP_KEY.match(rest):
                step = int(match.group(1))
                found[step] = found.get(step, False) or rest == f"step-{step}/{MARKER}"
    return found


def latest(s3: Any, where: S3Location) -> int | None:
    complete = [step for step, done in steps(s3, where).items() if done]
    return max(complete) if complete else None


def upload(
    s3: Any,
    staged: Path,
    where: S3Location,
    step: int,
    deadline: float,
    clock: Callable[[], float] = time.time,
) -> str:
    """Upload a staged DCP directory as step `step`; the marker last. Its URI."""
    files = sorted(p for p in staged.rglob("*") if p.is_file())
    for path in files:
        if clock() >= deadline:
            raise DeadlineExceeded(f"step-{step}: deadline reached after a partial upload")
        key = where.key(f"step-{step}", path.relative_to(staged).as_posix())
        s3.upload_file(str(path), where.bucket, key)
    if clock() >= deadline:
        raise DeadlineExceeded(f"step-{step}: deadline reached before the marker")
    s3.put_object(Bucket=where.bucket, Key=where.key(f"step-{step}", MARKER), Body=b"")
    return where.uri(f"step-{step}")


def download(s3: Any, where: S3Location, step: int, into: Path) -> None:
    base = where.key(f"step-{step}") + "/"
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=base):
        for obj in page.get("Contents", []):
            rest = str(obj["Key"]).removeprefix(base)
            if rest == MARKER:
                continue
            target = into / rest
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(where.bucket, str(obj["Key"]), str(target))


def save_staged(
    save: Callable[[Path], None], s3: Any, where: S3Location, step: int, deadline: float
) -> str:
    with tempfile.TemporaryDirectory(prefix="sco-dcp-") as tmp:
        staged = Path(tmp) / f"step-{step}"
        save(staged)
        return upload(s3, staged, where, step, deadline)


def load_staged(load: Callable[[Path], None], s3: Any, where: S3Location, step: int) -> None:
    with tempfile.TemporaryDirectory(prefix="sco-dcp-") as tmp:
        staged = Path(tmp) / f"step-{step}"
        download(s3, where, step, staged)
        load(staged)
