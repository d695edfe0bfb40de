"""The contract sync republishes the published commit when the notice keys change: a new
hall key (rotation) reaches the nodes without a contracts commit, and a retired key leaves
the bundle once its `not_after` has passed. The store is the in-memory fake, the remote a
local path (the transport is tests/contracts/test_contract_git_sync.py's)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contracts import keys
from contracts.gitsync import ContractSync, Outcome, SyncConfig
from contracts.notice_scopes import SCOPES_FILE, add_key, retire_key
from tests.contracts.fake_sync_store import FakeSyncStore
from tests.support.paths import REPO

pytestmark = pytest.mark.timeout(60)
REGIONS = REPO / "deploy" / "regions"


def _tools_or_skip() -> None:
    if shutil.which("git") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("git or ssh-keygen missing: apt-get install git openssh-client")


def signed_repo(tmp: Path) -> tuple[Path, Path, Path]:
    """A repository with one SSH-signed commit of the example contracts; (repo, trust dir,
    bundle signing key)."""
    _kid, private, public = keys.generate(tmp / "keys")
    trust = tmp / "trust"
    trust.mkdir()
    shutil.copy(public, trust / public.name)
    ssh = tmp / "alice_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh)], check=True)
    (trust / "allowed_signers").write_text(f"alice {ssh.with_suffix('.pub').read_text()}")
    repo = tmp / "repo"
    shutil.copytree(REPO / "contracts" / "examples", repo / "contracts")
    env = {"GIT_CONFIG_GLOBAL": str(tmp / "gitconfig"), "PATH": "/usr/bin:/bin"}
    (tmp / "gitconfig").write_text("[user]\n\tname = alice\n\temail = a@x\n")
    git = ["git", "-C", str(repo)]
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={ssh}"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True, env=env)
    subprocess.run([*git, "add", "-A"], check=True, env=env)
    subprocess.run([*git, *sign, "commit", "-qm", "contracts", "-S"], check=True, env=env)
    return repo, trust, private


def content(raw: bytes) -> dict[str, object]:
    doc: dict[str, object] = json.loads(raw)["content"]
    return doc


def r1_policy(raw: bytes) -> dict[str, object]:
    policies = content(raw)["notice_policies"]
    assert isinstance(policies, list)
    found: dict[str, object] = next(p for p in policies if p["region"] == "r1")
    return found


def test_a_rotated_key_is_republished_then_the_retired_one_left_out(tmp_path: Path) -> None:
    _tools_or_skip()
    repo, trust, private = signed_repo(tmp_path)
    notice_keys = tmp_path / "notice-keys"
    r1 = notice_keys / "r1"
    old = {}
    for hall in ("A", "B", "C", "D"):
        old[hall], _, _ = keys.generate(r1)
        add_key(r1, old[hall], [hall])
    for other in ("r2", "r3"):
        keys.generate(notice_keys / other)
    clock = [datetime.now(UTC)]
    store = FakeSyncStore(None, trust)
    sync = ContractSync(
        SyncConfig(
            remotes=(str(repo),),
            ref="main",
            path="contracts",
            mirror_dir=tmp_path / "mirror.git",
            trust_dir=trust,
            regions_dir=REGIONS,
            signing_key=keys.load_signing_key(private),
            notice_keys_dir=notice_keys,
        ),
        store,
        now=lambda: clock[0],
    )
    report = asyncio.run(sync.step())
    assert [r.outcome for r in report.results] == [Outcome.PUBLISHED]
    assert asyncio.run(sync.step()).results == []  # nothing changed: nothing published

    # Rotation, step 1: hall A's next key is published before it signs (no new commit).
    new_a, _, _ = keys.generate(r1)
    add_key(r1, new_a, ["A"])
    report = asyncio.run(sync.step())
    [rekeyed] = report.results
    assert rekeyed.outcome is Outcome.PUBLISHED and rekeyed.serial == 2
    assert "notice keys changed" in rekeyed.describe()
    assert store.current is not None
    scopes = r1_policy(store.current)["scopes"]
    assert isinstance(scopes, dict) and scopes[new_a] == {"halls": ["A"]}
    assert content(store.current)["source"] == content(store.published[0])["source"]

    # Step 2: the old key retires one lead from now; the bundle says so.
    not_after = clock[0] + timedelta(seconds=150)
    retire_key(r1, old["A"], not_after)
    report = asyncio.run(sync.step())
    assert [r.serial for r in report.results] == [3]
    scopes = r1_policy(store.current)["scopes"]
    assert isinstance(scopes, dict)
    assert datetime.fromisoformat(scopes[old["A"]]["not_after"]) == not_after

    # Past its not_after the next step leaves it out altogether.
    clock[0] = not_after + timedelta(seconds=1)
    report = asyncio.run(sync.step())
    assert [r.serial for r in report.results] == [4]
    keys_now = r1_policy(store.current)["keys"]
    assert isinstance(keys_now, dict) and old["A"] not in keys_now and new_a in keys_now

    # A broken scopes.yaml publishes nothing and is reported once, not every step.
    (r1 / SCOPES_FILE).write_text(f"{new_a}: {{halls: [Z]}}\n")
    report = asyncio.run(sync.step())
    [failed] = report.results
    assert failed.outcome is Outcome.COMPILE_ERROR and "hall Z not in region r1" in str(
        failed.findings[0]
    )
    assert asyncio.run(sync.step()).results == []
    assert len(store.published) == 4
