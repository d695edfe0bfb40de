"""Slurm admission from the contract bundle: the rendered job_submit.lua, checked twice.

Pure tests run the script under Lua 5.1 (the Lua Slurm's job_submit/lua plugin links) with a
stub `slurm` table; the cluster tests load it into a real slurmctld and submit with sbatch.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from contracts.admission.slurm import lua_string, render_job_submit_lua
from contracts.model import Contract
from tests.support import tools
from tests.support.paths import EXAMPLES
from tests.support.slurm_cluster import SlurmCluster, slurm_cluster

SERIAL = 42
DENIED = 2010  # the stub's ESLURM_ACCESS_DENIED
INVALID_ACCOUNT = 2045  # the stub's ESLURM_INVALID_ACCOUNT


def example_contracts() -> list[Contract]:
    return [
        Contract.model_validate(yaml.safe_load(path.read_text()), strict=False)
        for path in sorted(EXAMPLES.glob("*.yaml"))
    ]


def render(
    contracts: list[Contract] | None = None,
    *,
    serial: int = SERIAL,
    reclaimable_partitions: tuple[str, ...] = ("spot",),
    default_partition: str | None = None,
) -> str:
    return render_job_submit_lua(
        example_contracts() if contracts is None else contracts,
        serial=serial,
        reclaimable_partitions=reclaimable_partitions,
        default_partition=default_partition,
    )


# --- the script under plain Lua 5.1 -------------------------------------------------------

_DRIVER = """\
slurm = { SUCCESS = 0, ERROR = -1, ESLURM_ACCESS_DENIED = 2010, ESLURM_INVALID_ACCOUNT = 2045 }
function slurm.log_user(fmt, ...) io.write("user: ", string.format(fmt, ...), "\\n") end
function slurm.log_info(fmt, ...) io.write("info: ", string.format(fmt, ...), "\\n") end
dofile(arg[1])
local rc = {call}
io.write("rc: ", tostring(rc), "\\n")
"""


def _lua_table(fields: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{k} = {lua_string(v)}" for k, v in fields.items()) + " }"


@pytest.fixture(scope="module")
def lua() -> str:
    tools.require("lua5.1")
    return "lua5.1"


def run_lua(
    lua: str,
    tmp_path: Path,
    script: str,
    job: dict[str, str],
    job_rec: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Load `script` and submit `job` (or, with `job_rec`, modify that job); rc and output."""
    if job_rec is None:
        call = f"slurm_job_submit({_lua_table(job)}, {{}}, 1000)"
    else:
        call = f"slurm_job_modify({_lua_table(job)}, {_lua_table(job_rec)}, {{}}, 1000)"
    (tmp_path / "job_submit.lua").write_text(script)
    (tmp_path / "driver.lua").write_text(_DRIVER.replace("{call}", call))
    # Bytes, not text: text mode would turn a \r\n in the output into \n.
    done = subprocess.run(
        [lua, str(tmp_path / "driver.lua"), str(tmp_path / "job_submit.lua")],
        capture_output=True,
        check=False,
    )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    rc = re.search(r"^rc: (-?\d+)$", out, re.M)
    assert rc, out
    return int(rc[1]), out


def test_rendering_is_deterministic() -> None:
    contracts = example_contracts()
    first = render(contracts)
    assert first == render(list(reversed(contracts)))
    assert first == render(contracts, reclaimable_partitions=("spot", "spot"))
    assert f"serial {SERIAL}" in first
    assert render(contracts, serial=SERIAL + 1) != first


def test_rendering_refuses_a_bad_serial() -> None:
    with pytest.raises(ValueError, match="serial"):
        render(serial=-1)


def test_a_hostile_owner_cannot_break_out_of_the_script(lua: str, tmp_path: Path) -> None:
    owner = 'evil" ]] ]=] \'\n-- os.exit(3)\r\n\\" %s %d @KNOWN_TAGS@ \x1b[31m é'
    raw = yaml.safe_load((EXAMPLES / "ci-runners.yaml").read_text())
    contract = Contract.model_validate({**raw, "owner": owner}, strict=False)
    script = render([contract], reclaimable_partitions=("spot", 'sp"ot\n'))
    syntax = subprocess.run(
        ["luac5.1", "-p", "-"],  # same Debian package as lua5.1
        input=script,
        capture_output=True,
        text=True,
        check=False,
    )
    assert syntax.returncode == 0, syntax.stderr
    rc, out = run_lua(
        lua, tmp_path, script, {"partition": "spot", "account": "ci", "comment": "sco-contract=ci"}
    )
    assert rc == 0
    assert f"(owner {owner})" in out  # the owner survived escaping byte for byte


@pytest.mark.parametrize(
    ("job", "default", "expected", "says"),
    [
        ({"partition": "batch"}, None, 0, None),
        ({}, None, 0, None),  # the default partition is not reclaimable
        ({"account": "ci"}, "spot", DENIED, "need a contract"),
        ({"partition": "batch,spot", "account": "ci"}, None, DENIED, "need a contract"),
        (
            {"partition": "spot", "account": "ci", "comment": "nosco-contract=ci"},
            None,
            DENIED,
            "need a",
        ),
        ({"partition": "spot", "comment": "sco-contract=ci"}, None, INVALID_ACCOUNT, "--account"),
        ({"partition": "spot", "account": "CI", "comment": "x; sco-contract=ci"}, None, 0, None),
        (
            {"partition": "batch,spot", "account": "mlr", "comment": "sco-contract=llm-train"},
            None,
            0,
            None,
        ),
        (
            {"partition": "spot", "account": "ci", "comment": "sco-contract=spark-etl"},
            None,
            DENIED,
            "unknown contract",
        ),
    ],
)
def test_admission_rules(
    lua: str,
    tmp_path: Path,
    job: dict[str, str],
    default: str | None,
    expected: int,
    says: str | None,
) -> None:
    rc, out = run_lua(lua, tmp_path, render(default_partition=default), job)
    assert rc == expected, out
    if says is not None:
        assert says in out
        assert f"SCO bundle {SERIAL}" in out


def test_updates_are_checked_only_when_they_touch_the_contract(lua: str, tmp_path: Path) -> None:
    script = render()
    on_batch = {"job_id": "7", "partition": "batch", "account": "ci"}
    assert run_lua(lua, tmp_path, script, {}, on_batch)[0] == 0
    rc, out = run_lua(lua, tmp_path, script, {"partition": "spot"}, on_batch)
    assert rc == DENIED
    assert "user:" not in out  # Slurm discards log_user during job_modify
    assert "update of job 7 refused: jobs on reclaimable partition 'spot' need a contract" in out
    on_spot = {"job_id": "8", "partition": "spot", "account": "ci", "comment": "sco-contract=ci"}
    assert run_lua(lua, tmp_path, script, {}, on_spot)[0] == 0  # e.g. a hold
    assert run_lua(lua, tmp_path, script, {"comment": "gone"}, on_spot)[0] == DENIED


# --- a real slurmctld ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    tools.require(*tools.SLURMCTLD)
    with slurm_cluster(render()) as running:
        yield running


def sbatch(cluster: SlurmCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return cluster.run("sbatch", "--wrap", "sleep 1", *args)


def assert_refused(done: subprocess.CompletedProcess[str], reason: str) -> None:
    assert done.returncode != 0, done.stdout
    # sbatch prints the script's log_user message, then Slurm's own error line.
    assert f"sbatch: error: {reason}" in done.stderr
    assert "Batch job submission failed" in done.stderr


def assert_submitted(done: subprocess.CompletedProcess[str]) -> int:
    assert done.returncode == 0, done.stderr
    match = re.fullmatch(r"Submitted batch job (\d+)\n", done.stdout)
    assert match, done.stdout
    return int(match[1])


def test_the_controller_loaded_the_bundle(cluster: SlurmCluster) -> None:
    assert f"sco bundle {SERIAL}: job_submit.lua loaded" in cluster.log()


def test_refuses_a_spot_job_without_a_contract(cluster: SlurmCluster) -> None:
    assert_refused(
        sbatch(cluster, "-p", "spot", "-A", "ci"),
        "jobs on reclaimable partition 'spot' need a contract: add --comment=sco-contract=<name>",
    )


def test_refuses_an_unknown_contract(cluster: SlurmCluster) -> None:
    assert_refused(
        sbatch(cluster, "-p", "spot", "-A", "ci", "--comment=sco-contract=no-such"),
        "unknown contract 'no-such'",
    )


def test_refuses_an_account_the_contract_does_not_allow(cluster: SlurmCluster) -> None:
    assert_refused(
        sbatch(cluster, "-p", "spot", "-A", "mlr", "--comment=sco-contract=ci"),
        "contract 'ci' does not allow account 'mlr' on partition 'spot'",
    )


def test_refuses_a_spot_job_without_an_account(cluster: SlurmCluster) -> None:
    assert_refused(
        sbatch(cluster, "-p", "spot", "--comment=sco-contract=ci"),
        "jobs on reclaimable partition 'spot' need an account: pass --account=<account>",
    )


def test_accepts_a_job_under_its_contract(cluster: SlurmCluster) -> None:
    job = assert_submitted(
        sbatch(cluster, "-p", "spot", "-A", "mlr", "--comment=sco-contract=llm-train")
    )
    shown = cluster.run("scontrol", "show", "job", str(job)).stdout
    assert "Partition=spot" in shown and "Account=mlr" in shown
    assert f"sco bundle {SERIAL}: submission accepted: contract llm-train" in cluster.log()


def test_jobs_off_reclaimable_capacity_need_no_contract(cluster: SlurmCluster) -> None:
    assert_submitted(sbatch(cluster, "-p", "batch"))
    assert_submitted(sbatch(cluster))  # the default partition, batch


def test_a_job_cannot_move_onto_spot_without_a_contract(cluster: SlurmCluster) -> None:
    job = assert_submitted(sbatch(cluster, "-p", "batch", "-A", "ci"))
    moved = cluster.run("scontrol", "update", f"jobid={job}", "partition=spot")
    assert moved.returncode != 0
    assert "Access/permission denied" in moved.stderr
    assert cluster.run("scontrol", "hold", str(job)).returncode == 0  # unrelated updates pass
