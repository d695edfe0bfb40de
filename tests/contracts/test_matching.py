"""The one contract-matching rule, on the cases where the node agent and the demand intake
used to disagree, and both of them reaching it through their own workload types."""

from __future__ import annotations

import pytest

from activities.demand.model import PendingWork, Scheduler, normalise
from agent.scheduler import Workload
from contracts.matching import PodIdentity, SlurmIdentity, match_contract
from contracts.model import CONTRACT_LABEL, Contract
from tests.support.contract_fixtures import example

pytestmark = pytest.mark.timeout(30)

NAMES = ["ci-runners", "llm-train", "search-api", "spark-etl"]
SPARK_EXECUTOR = {"app.kubernetes.io/component": "spark-executor"}


def contracts() -> list[Contract]:
    return [Contract.model_validate(example(n), strict=False) for n in NAMES]


def name_of(found: Contract | str) -> str | None:
    return found.name if isinstance(found, Contract) else None


def test_a_tagged_job_on_an_allowed_account_and_partition_matches() -> None:
    found = match_contract(contracts(), SlurmIdentity("ci", "ci", "spot"))
    assert name_of(found) == "ci-runners"
    # No tag in the selector: the contract's own name is the tag.
    assert name_of(match_contract(contracts(), SlurmIdentity("llm-train", "mlr", "spot"))) == (
        "llm-train"
    )


def test_a_tag_alone_does_not_make_a_contract() -> None:
    """The agent took the tag alone; admission and the control plane also want the account
    and the partition the contract allows."""
    cs = contracts()
    assert match_contract(cs, SlurmIdentity("ci", "", "")) == (
        "no contract's slurm selector matches this work naming 'ci'"
    )
    assert name_of(match_contract(cs, SlurmIdentity("ci", "mlr", "spot"))) is None
    assert name_of(match_contract(cs, SlurmIdentity("ci", "ci", "batch"))) is None


def test_a_contract_with_its_own_tag_is_not_named_by_its_name() -> None:
    """ci-runners' selector has tag `ci`: the agent also took `sco-contract=ci-runners`."""
    found = match_contract(contracts(), SlurmIdentity("ci-runners", "ci", "spot"))
    assert found == "no contract's slurm selector matches this work naming 'ci-runners'"


def test_a_slurm_job_cannot_name_a_kubernetes_only_contract() -> None:
    found = match_contract(contracts(), SlurmIdentity("spark-etl", "ci", "spot"))
    assert name_of(found) is None


def test_an_untagged_job_is_under_no_contract_even_on_a_selectors_account() -> None:
    """The agent fell back to the first selector taking the account and partition."""
    found = match_contract(contracts(), SlurmIdentity(None, "mlr", "spot"))
    assert found == "job names no contract (--comment=sco-contract=<name>)"


def test_accounts_compare_in_lower_case_as_slurm_and_admission_do() -> None:
    data = example("llm-train")
    data["selectors"]["slurm"][0]["account"] = "MLR"
    upper = Contract.model_validate(data, strict=False)
    assert name_of(match_contract([upper], SlurmIdentity("llm-train", "mlr", "spot"))) == (
        "llm-train"
    )


def test_a_labelled_pod_matching_a_selector_matches() -> None:
    labels = {CONTRACT_LABEL: "llm-train", "team": "ml-research", "extra": "ok"}
    found = match_contract(contracts(), PodIdentity("llm-train", "training", labels))
    assert name_of(found) == "llm-train"


def test_a_label_alone_does_not_make_a_contract() -> None:
    """The agent took the label alone; the selector's namespace and labels must hold too."""
    cs = contracts()
    wrong_namespace = PodIdentity("spark-etl", "ci", {CONTRACT_LABEL: "spark-etl"})
    assert match_contract(cs, wrong_namespace) == (
        "no contract's kubernetes selector matches this work naming 'spark-etl'"
    )
    missing_label = PodIdentity("spark-etl", "data-pipelines", {CONTRACT_LABEL: "spark-etl"})
    assert name_of(match_contract(cs, missing_label)) is None


def test_an_unlabelled_pod_is_under_no_contract_even_in_a_selectors_namespace() -> None:
    """Both old rules took it by its namespace; admission refuses it on reclaimable
    capacity, so it is no demand for reclaimable capacity either."""
    found = match_contract(contracts(), PodIdentity(None, "data-pipelines", SPARK_EXECUTOR))
    assert found == f"pod names no contract (label {CONTRACT_LABEL}=<name>)"


def test_two_contracts_taking_the_same_job_are_ambiguous() -> None:
    cs = contracts()
    twin = cs[0].model_copy(update={"name": "ci-twin"})
    found = match_contract([*cs, twin], SlurmIdentity("ci", "ci", "spot"))
    assert found == "ambiguous: selectors of ci-runners, ci-twin all match"


# The node agent's and the demand intake's view of the same work, through their own types.
CASES: list[tuple[Workload, PendingWork, str | None]] = [
    (
        Workload(
            id="1", socket_name="s", account="ci", partition="spot", comment="sco-contract=ci"
        ),
        PendingWork(
            scheduler=Scheduler.SLURM, ref="1", contract="ci", account="ci", partition="spot",
            vcpu=1, memory_gib=1,
        ),
        "ci-runners",
    ),
    (
        Workload(id="2", socket_name="s", comment="sco-contract=ci"),
        PendingWork(scheduler=Scheduler.SLURM, ref="2", contract="ci", vcpu=1, memory_gib=1),
        None,
    ),
    (
        Workload(id="3", socket_name="s", account="mlr", partition="spot"),
        PendingWork(
            scheduler=Scheduler.SLURM, ref="3", account="mlr", partition="spot",
            vcpu=1, memory_gib=1,
        ),
        None,
    ),
    (
        Workload(id="ci/a", socket_name="s", namespace="ci"),
        PendingWork(
            scheduler=Scheduler.KUBERNETES, ref="ci/a", namespace="ci", vcpu=1, memory_gib=1
        ),
        None,
    ),
    (
        Workload(
            id="data-pipelines/e", socket_name="s", namespace="data-pipelines",
            labels={CONTRACT_LABEL: "spark-etl", **SPARK_EXECUTOR},
        ),
        PendingWork(
            scheduler=Scheduler.KUBERNETES, ref="data-pipelines/e", contract="spark-etl",
            namespace="data-pipelines", labels={CONTRACT_LABEL: "spark-etl", **SPARK_EXECUTOR},
            vcpu=1, memory_gib=1,
        ),
        "spark-etl",
    ),
    (
        Workload(id="ci/b", socket_name="s", namespace="ci", labels={CONTRACT_LABEL: "spark-etl"}),
        PendingWork(
            scheduler=Scheduler.KUBERNETES, ref="ci/b", contract="spark-etl", namespace="ci",
            labels={CONTRACT_LABEL: "spark-etl"}, vcpu=1, memory_gib=1,
        ),
        None,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("node", "pending", "expected"), CASES, ids=[c[0].id for c in CASES])
def test_the_node_agent_and_the_demand_intake_agree(
    node: Workload, pending: PendingWork, expected: str | None
) -> None:
    cs = contracts()
    assert node.identity() == pending.identity()
    assert name_of(match_contract(cs, node.identity())) == expected
    demand = normalise(cs, "r1", [pending])
    assert list(demand.units) == ([expected] if expected else [])
