"""`sco checkpoints provision` and `list` against a real Ceph RGW (tests/support/rgw.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from activities.checkpoints.rgw import read_credentials
from tests.support.checkpoint_bundle import signed_bundle
from tests.support.rgw import RgwCluster
from workers.cli.main import app

pytestmark = pytest.mark.timeout(420)  # may be the test that brings RGW up (rgw.START_TIMEOUT_S)
runner = CliRunner()


def _provision(rgw: RgwCluster, bundle: Path, trust: Path, creds: Path) -> list[dict[str, str]]:
    args = ["checkpoints", "provision", str(bundle), "--trust", str(trust)]
    args += ["--endpoint", rgw.endpoint, "--ceph-conf", str(rgw.ceph_conf)]
    result = runner.invoke(app, [*args, "--credentials", str(creds), "--json"])
    assert result.exit_code == 0, result.output
    rows: list[dict[str, str]] = json.loads(result.output)
    return rows


def test_provision_gives_each_contract_its_own_user_bucket_and_expiry(
    rgw: RgwCluster, tmp_path: Path
) -> None:
    bundle, trust = signed_bundle(tmp_path)
    creds_dir = tmp_path / "creds"
    rows = _provision(rgw, bundle, trust, creds_dir)
    assert [(r["contract"], r["user"], r["bucket"]) for r in rows] == [
        ("llm-train", "sco-ckpt-llm-train", "checkpoints"),
        ("llm-tune", "sco-ckpt-llm-tune", "tune-ckpt"),
    ]
    train, tune = (read_credentials(creds_dir, c) for c in ("llm-train", "llm-tune"))
    assert train.access_key != tune.access_key
    assert (creds_dir / "llm-train.json").stat().st_mode & 0o777 == 0o600

    # Idempotent: the same keys, the same buckets, no error.
    assert _provision(rgw, bundle, trust, creds_dir) == rows
    assert read_credentials(creds_dir, "llm-train") == train

    rules = train.s3().get_bucket_lifecycle_configuration(Bucket="checkpoints")["Rules"]
    assert [(r["Status"], r["Expiration"]["Days"]) for r in rules] == [("Enabled", 7)]

    # Each contract's keys reach its own bucket and are refused on the other's.
    train.s3().put_object(Bucket="checkpoints", Key="llm-train/step-3/COMPLETE", Body=b"")
    train.s3().put_object(Bucket="checkpoints", Key="llm-train/step-5/__0_0.distcp", Body=b"x")
    train.s3().put_object(Bucket="checkpoints", Key="llm-train/job-1/step-2/COMPLETE", Body=b"")
    refusals: list[Callable[[], object]] = [
        lambda: tune.s3().get_object(Bucket="checkpoints", Key="llm-train/step-3/COMPLETE"),
        lambda: tune.s3().list_objects_v2(Bucket="checkpoints"),
        lambda: tune.s3().put_object(Bucket="checkpoints", Key="llm-train/x", Body=b"x"),
    ]
    for op in refusals:
        with pytest.raises(ClientError) as refused:
            op()
        assert refused.value.response["Error"]["Code"] == "AccessDenied"

    listed = runner.invoke(
        app, ["checkpoints", "list", "llm-train", "--credentials", str(creds_dir), "--json"]
    )
    assert listed.exit_code == 0, listed.output
    # The session's RGW is shared: other tests' runs (run-*) may be there too.
    mine = [c for c in json.loads(listed.output) if c["run"] in ("", "job-1")]
    steps = [(c["run"], c["step"], c["state"]) for c in mine]
    assert steps == [("", 3, "complete"), ("", 5, "partial"), ("job-1", 2, "complete")]


def test_list_without_provisioned_credentials_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["checkpoints", "list", "llm-train", "--credentials", str(tmp_path)]
    )
    assert result.exit_code == 1
    assert "llm-train.json" in result.output and "sco checkpoints provision" in result.output
