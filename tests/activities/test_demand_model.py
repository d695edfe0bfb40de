"""Pure demand-intake code: hostlists, squeue and scontrol parsing, matching work to
contracts, normalising to units, and planning a Slurm resume."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from activities.demand.hostlist import HostlistError, expand, ranged
from activities.demand.model import PendingWork, Scheduler, normalise, units_for
from activities.demand.slurm import array_task_count, parse_squeue_json, parse_tres
from activities.demand.slurm_resume import (
    SlurmJob,
    SlurmNode,
    feature_list,
    parse_resume_file,
    parse_show_node,
    plan_resume,
    render_user_data,
)
from activities.demand.source import SourceUnavailable
from contracts.matching import match_contract
from contracts.model import CONTRACT_LABEL, Contract, UnitShape
from contracts.region import Region
from tests.support.contract_fixtures import example
from workflows.acquisition.models import LaunchItem

pytestmark = pytest.mark.timeout(30)


def contracts() -> list[Contract]:
    names = ["ci-runners", "llm-train", "search-api", "spark-etl"]
    return [Contract.model_validate(example(n), strict=False) for n in names]


# -- hostlists --------------------------------------------------------------------------


def test_hostlists_expand_ranges_lists_and_several_brackets() -> None:
    assert expand("r1-a-gp-l-[001-003,007],login1") == [
        "r1-a-gp-l-001",
        "r1-a-gp-l-002",
        "r1-a-gp-l-003",
        "r1-a-gp-l-007",
        "login1",
    ]
    assert expand("rack[1-2]-n[1-2]") == ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
    assert expand("n[8-11]") == ["n8", "n9", "n10", "n11"]
    assert expand("a,a,b") == ["a", "b"]
    assert expand(ranged("x-", 3)) == ["x-001", "x-002", "x-003"]
    assert ranged("x-", 1) == "x-001"


@pytest.mark.parametrize("bad", ["n[1-2", "n1-2]", "n[a-b]", "n[3-1]"])
def test_bad_hostlists_say_what_is_wrong(bad: str) -> None:
    with pytest.raises(HostlistError, match="hostlist"):
        expand(bad)


# -- squeue -----------------------------------------------------------------------------


def test_tres_and_array_strings() -> None:
    assert parse_tres("cpu=4,mem=16G,node=1,billing=4,gres/gpu=2") == {
        "cpu": 4.0,
        "mem": 16.0,
        "node": 1.0,
        "billing": 4.0,
        "gres/gpu": 2.0,
    }
    assert parse_tres("cpu=1,mem=512M")["mem"] == 0.5
    assert array_task_count("1-100%10") == 100
    assert array_task_count("1-9:2,20") == 6
    assert array_task_count("") == 1


def test_squeue_json_of_newer_slurm_is_read_too() -> None:
    """23.11+: job_state is a list of flags and numbers are {set, number}."""
    raw = json.dumps(
        {
            "jobs": [
                {
                    "job_id": 7,
                    "job_state": ["PENDING"],
                    "state_reason": "Resources",
                    "account": "ci",
                    "partition": "spot",
                    "comment": "sco-contract=ci",
                    "cpus": {"set": True, "number": 2},
                    "tres_req_str": "",
                    "array_task_string": "",
                },
                {"job_id": 8, "job_state": ["RUNNING"], "state_reason": "None"},
                {"job_id": 9, "job_state": "PENDING", "state_reason": "JobHeldUser"},
            ]
        }
    )
    [work] = parse_squeue_json(raw)
    assert (work.ref, work.contract, work.vcpu, work.count) == ("7", "ci", 2.0, 1)
    with pytest.raises(SourceUnavailable, match="not a job list"):
        parse_squeue_json(b"<html>")


# -- matching and units -----------------------------------------------------------------


def test_units_are_set_by_the_largest_dimension_and_at_least_one() -> None:
    unit = UnitShape(vcpu=2, memory_gib=4)
    work = PendingWork(scheduler=Scheduler.SLURM, ref="1", vcpu=2, memory_gib=12, count=3)
    assert units_for(unit, work) == 9  # memory decides: 3 units each
    empty = PendingWork(scheduler=Scheduler.KUBERNETES, ref="ns/p", vcpu=0, memory_gib=0)
    assert units_for(unit, empty) == 1
    gpu = UnitShape(vcpu=8, memory_gib=64, gpus=1)
    assert units_for(gpu, work.model_copy(update={"gpus": 4, "count": 1})) == 4


def test_work_matches_through_the_bundles_selectors() -> None:
    cs = contracts()
    job = PendingWork(
        scheduler=Scheduler.SLURM,
        ref="1",
        contract="ci",
        account="ci",
        partition="spot",
        vcpu=2,
        memory_gib=4,
    )
    found = match_contract(cs, job.identity())
    assert isinstance(found, Contract) and found.name == "ci-runners"
    untagged = job.model_copy(update={"contract": None})
    assert (
        match_contract(cs, untagged.identity())
        == "job names no contract (--comment=sco-contract=<name>)"
    )
    pod = PendingWork(
        scheduler=Scheduler.KUBERNETES,
        ref="ci/x",
        contract="ci-runners",
        namespace="ci",
        labels={CONTRACT_LABEL: "ci-runners"},
        vcpu=1,
        memory_gib=1,
    )
    found = match_contract(cs, pod.identity())
    assert isinstance(found, Contract) and found.name == "ci-runners"
    # A pod naming another contract than its namespace's is not silently re-attributed.
    wrong = pod.model_copy(update={"contract": "spark-etl"})
    assert "naming 'spark-etl'" in str(match_contract(cs, wrong.identity()))
    # Two contracts whose selectors both take the work: refused, with both names.
    twin = cs[0].model_copy(update={"name": "ci-twin"})
    assert (
        match_contract([*cs, twin], job.identity())
        == "ambiguous: selectors of ci-runners, ci-twin all match"
    )


def test_normalise_sums_per_contract_and_keeps_the_unmatched() -> None:
    pods = [
        PendingWork(
            scheduler=Scheduler.KUBERNETES,
            ref=f"ci/p{i}",
            contract="ci-runners",
            namespace="ci",
            vcpu=2,
            memory_gib=4,
        )
        for i in range(3)
    ]
    stray = PendingWork(
        scheduler=Scheduler.KUBERNETES,
        ref="x/y",
        contract="ci-runners",
        namespace="x",
        vcpu=1,
        memory_gib=1,
    )
    out = normalise(contracts(), "r1", [*pods, stray])
    assert out.units == {"ci-runners": 3} and out.items == {"ci-runners": 3}
    assert [u.ref for u in out.unmatched] == ["x/y"]
    # A region the contract does not list: nothing matches there.
    assert normalise(contracts(), "r9", pods).units == {}


# -- Slurm power saving -----------------------------------------------------------------


def test_resume_files_of_both_formats() -> None:
    old = '{"jobs":[{"job_id":1,"nodes":"n[1-2]"}],"all_nodes":"n[1-2]"}'
    new = (
        '{"all_nodes_resume":"n3","jobs":[{"job_id":4,"nodes_alloc":"n[3-4]",'
        '"nodes_resume":"n3","partition":"spot"}]}'
    )
    assert parse_resume_file(old) == {"n1": 1, "n2": 1}
    assert parse_resume_file(new) == {"n3": 4}


def test_show_node_lines_give_features_and_pool() -> None:
    features = ",".join(feature_list("r1.A.gp.l", "A", "gp", "l", "reclaimable"))
    text = (
        f"NodeName=n1 Arch=x86_64 AvailableFeatures={features} ActiveFeatures={features} "
        "State=IDLE+CLOUD+POWERED_DOWN\n"
        "NodeName=batch1 AvailableFeatures=(null) State=IDLE\n"
    )
    nodes = parse_show_node(text)
    assert nodes["n1"].pool_id == "r1.A.gp.l" and nodes["batch1"].pool_id is None
    assert nodes["batch1"].features == []


def test_resume_plan_groups_by_contract_and_pool_and_says_why_not(region_r1: Region) -> None:
    pool = feature_list("r1.A.gp.l", "A", "gp", "l", "reclaimable")
    info = {
        "a1": SlurmNode(name="a1", features=pool),
        "a2": SlurmNode(name="a2", features=pool),
        "nopool": SlurmNode(name="nopool", features=["sco"]),
        "elsewhere": SlurmNode(name="elsewhere", features=["pool_r2.A.gp.l"]),
        "idle": SlurmNode(name="idle", features=pool),
        "stranger": SlurmNode(name="stranger", features=pool),
    }
    ci = SlurmJob(job_id=1, account="ci", partition="spot", comment="sco-contract=ci")
    stray = SlurmJob(job_id=2, account="nobody", partition="spot", comment="sco-contract=ci")
    jobs = {"a1": ci, "a2": ci, "nopool": ci, "elsewhere": ci, "stranger": stray}
    nodes = [*info, "unknown"]
    plan = plan_resume(nodes, info, jobs, contracts(), region_r1)
    [group] = plan.groups
    assert (group.contract, group.pool_id, group.nodes, group.jobs) == (
        "ci-runners",
        "r1.A.gp.l",
        ["a1", "a2"],
        [1],
    )
    assert group.units == 4  # gp.l (4 vCPU, 16 GiB) holds two 2-vCPU units, twice
    assert plan.refused == {
        "nopool": "node has no pool_<pool id> feature",
        "elsewhere": "pool r2.A.gp.l is not a pool of region r1",
        "idle": "no job is waiting for this node (powered up by hand?)",
        "stranger": "job 2: no contract's slurm selector matches this work naming 'ci'",
        "unknown": "slurmctld does not know this node",
    }


def test_user_data_keeps_the_hostname_for_the_acquisition() -> None:
    out = render_user_data("hostname: {hostname}\nserver: {slurmctld}\n", slurmctld="ctl:6817")
    assert out == "hostname: {hostname}\nserver: ctl:6817\n"


def test_a_launch_item_names_every_instance_or_none() -> None:
    with pytest.raises(ValidationError, match="hostnames: 1 given for 2 instance"):
        LaunchItem(
            pool_id="r1.A.gp.l", hall="A", flavor="gp.l", instances=2, units=2, hostnames=["a"]
        )
