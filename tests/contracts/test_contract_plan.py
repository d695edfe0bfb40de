"""`sco contracts plan BASE HEAD` on three recorded changes, each against the same estate
snapshot (tests/data/contract_plan/estate-r1.json), its Markdown and JSON checked in as
golden files beside the change:

- floor-moved-between-halls: search-api leaves hall D; its floor moves to A-C;
- sku-removed-with-running-instances: spark-etl drops `mem` while 16 instances run on it;
- spend-authority-below-running-fallback: search-api's authority 12.5/h → 2/h while it
  runs 2.82/h of committed fallback (infeasible: exit 2).

The repository is made here: BASE commits tests/data/contract_plan/base, HEAD the change's
files over it. `SCO_UPDATE_GOLDENS=1` rewrites the golden files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.paths import REPO
from workers.cli.main import app

pytestmark = pytest.mark.timeout(120)

DATA = REPO / "tests" / "data" / "contract_plan"
CASES = {
    "floor-moved-between-halls": 0,
    "sku-removed-with-running-instances": 0,
    "spend-authority-below-running-fallback": 2,
}


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": os.environ["PATH"]}
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@x", *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return done.stdout.strip()


def _repo(tmp: Path, case: str) -> tuple[Path, str, str]:
    if shutil.which("git") is None:
        pytest.skip("git missing: apt-get install git")
    repo = tmp / "repo"
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(repo)], check=True)
    shutil.copytree(DATA / "base", repo / "contracts")
    _git(repo, "add", "-A")
    _git(repo, "commit", "--quiet", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD")
    for f in (DATA / case).glob("*.yaml"):
        shutil.copy(f, repo / "contracts" / f.name)
    _git(repo, "add", "-A")
    _git(repo, "commit", "--quiet", "-m", case)
    return repo, base, _git(repo, "rev-parse", "HEAD")


def _golden(path: Path, text: str) -> None:
    if os.environ.get("SCO_UPDATE_GOLDENS") == "1":
        path.write_text(text)
    assert path.exists(), f"{path} missing: SCO_UPDATE_GOLDENS=1 writes it"
    assert text == path.read_text(), f"{path} differs (SCO_UPDATE_GOLDENS=1 rewrites it)"


def _stable(text: str, base: str, head: str) -> str:
    """Commit ids differ per run (dates): the golden files name them BASE and HEAD."""
    return (
        text.replace(base, "BASE" + "0" * 36)
        .replace(head, "HEAD" + "0" * 36)
        .replace(base[:12], "BASE00000000")
        .replace(head[:12], "HEAD00000000")
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_of_a_recorded_change_matches_its_golden_files(tmp_path: Path, case: str) -> None:
    repo, base, head = _repo(tmp_path, case)
    runner = CliRunner()
    env = {"SCO_REGIONS_DIR": str(REPO / "deploy" / "regions")}
    outputs = {}
    for fmt in ("markdown", "json"):
        res = runner.invoke(
            app,
            [
                "contracts",
                "plan",
                base,
                head,
                "--repo",
                str(repo),
                "--estate",
                str(DATA / "estate-r1.json"),
                "--format",
                fmt,
            ],
            env=env,
        )
        assert res.exit_code == CASES[case], res.output
        outputs[fmt] = _stable(res.stdout, base, head)
    _golden(DATA / case / "plan.md", outputs["markdown"])
    _golden(DATA / case / "plan.json", outputs["json"])
    doc = json.loads(outputs["json"])
    assert doc["feasible"] is (CASES[case] == 0)


def test_the_recorded_changes_show_what_they_are_about() -> None:
    floor = json.loads((DATA / "floor-moved-between-halls" / "plan.json").read_text())
    moved = {(f["hall"], f["before"], f["after"]) for f in floor["floors"]}
    assert any(h == "D" and after == 0 and before > 0 for h, before, after in moved)
    sku = json.loads((DATA / "sku-removed-with-running-instances" / "plan.json").read_text())
    assert {d["pool_id"] for d in sku["drift"]} == {"r1.C.mem.xl", "r1.D.mem.xl"}
    assert sum(d["instances"] for d in sku["drift"]) == 16
    spend = json.loads((DATA / "spend-authority-below-running-fallback" / "plan.json").read_text())
    assert any("running fallback" in why for why in spend["infeasible"])


def test_the_ci_example_runs_the_plan_on_a_pull_request_and_posts_it() -> None:
    import yaml

    doc = yaml.safe_load((REPO / "deploy" / "ci" / "contracts-plan.yml").read_text())
    # YAML 1.1 reads the key `on` as True; Forgejo and GitHub read it as "on".
    triggers = doc.get("on", doc.get(True))
    assert "pull_request" in triggers
    (job,) = doc["jobs"].values()
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "sco contracts plan" in runs and "--format markdown" in runs
    assert "base.sha" in runs and "head.sha" in runs
    assert any("createComment" in str(step.get("with", {})) for step in job["steps"])
