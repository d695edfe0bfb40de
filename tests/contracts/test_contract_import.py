"""Migration (`sco contracts import DIR --repo PATH`): today's contract directory becomes the
repository's first commit keeping the serial of the bundle in use; the sync adopts that
commit at that serial (nothing republished) and the next commit gets the next serial.

The sync's store is an in-memory fake (tests/contracts/fake_sync_store.py), the remote a
local path: what is under test is the serial bookkeeping, not the transport (the real git
server and NATS are tests/contracts/test_contract_git_sync.py).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contracts import keys
from contracts.compiler import compile_and_sign
from contracts.gitsync import ContractSync, Outcome, SyncConfig
from tests.contracts.fake_sync_store import FakeSyncStore
from tests.support.paths import REPO
from workers.cli.main import app

pytestmark = pytest.mark.timeout(120)


def _tools_or_skip() -> None:
    if shutil.which("git") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("git or ssh-keygen missing: apt-get install git openssh-client")


def test_import_keeps_the_serial_and_the_next_commit_gets_the_next(tmp_path: Path) -> None:
    _tools_or_skip()
    _kid, private, public = keys.generate(tmp_path / "keys")
    trust = tmp_path / "trust"
    trust.mkdir()
    shutil.copy(public, trust / public.name)
    ssh = tmp_path / "alice_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh)], check=True)
    (trust / "allowed_signers").write_text(f"alice {ssh.with_suffix('.pub').read_text()}")
    # The bundle in use today: serial 41, compiled from a directory.
    current = tmp_path / "bundle.json"
    result, serial = compile_and_sign(
        REPO / "contracts" / "examples",
        REPO / "deploy" / "regions",
        keys.load_signing_key(private),
        current,
        serial=41,
        created_at=datetime(2026, 12, 1, tzinfo=UTC),
    )
    assert serial == 41, result.findings
    repo = tmp_path / "repo"
    env = {
        "GIT_CONFIG_GLOBAL": str(tmp_path / "gitconfig"),
        "SCO_REGIONS_DIR": str(REPO / "deploy" / "regions"),
    }
    (tmp_path / "gitconfig").write_text("[user]\n\tname = alice\n\temail = a@x\n")
    res = CliRunner().invoke(
        app,
        [
            "contracts",
            "import",
            str(REPO / "contracts" / "examples"),
            "--repo",
            str(repo),
            "--bundle",
            str(current),
            "--sign-with",
            str(ssh),
        ],
        env=env,
    )
    assert res.exit_code == 0, res.output
    assert "at serial 41" in res.stdout
    git = ["git", "-C", str(repo)]
    message = subprocess.run([*git, "log", "-1", "--format=%B"], capture_output=True, text=True)
    assert "SCO-Serial: 41" in message.stdout

    store = FakeSyncStore(current.read_bytes(), trust)
    sync = ContractSync(
        SyncConfig(
            remotes=(str(repo),),
            ref="main",
            path="contracts",
            mirror_dir=tmp_path / "mirror.git",
            trust_dir=trust,
            regions_dir=REPO / "deploy" / "regions",
            signing_key=keys.load_signing_key(private),
        ),
        store,
    )
    report = asyncio.run(sync.step())
    assert [r.outcome for r in report.results] == [Outcome.ADOPTED]
    assert report.held is not None and report.held.serial == 41
    assert store.published == []  # adopted, not republished

    llm = repo / "contracts" / "llm-train.yaml"
    llm.write_text(llm.read_text().replace("grace_seconds: 100", "grace_seconds: 90"))
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={ssh}"]
    subprocess.run(
        [*git, *sign, "commit", "-qam", "llm-train: 90 s grace", "-S"],
        check=True,
        env={**env, "PATH": "/usr/bin:/bin"},
    )
    report = asyncio.run(sync.step())
    assert [r.outcome for r in report.results] == [Outcome.PUBLISHED]
    assert [json.loads(raw)["content"]["serial"] for raw in store.published] == [42]
