"""The Kyverno ClusterPolicy that guards reclaimable capacity, tested without Kyverno.

How the policy is tested here (no Kubernetes API server and no Kyverno run on this machine):

1. Structure: the rendered policy is validated with `jsonschema` (Draft 2020-12) against
   the `kyverno.io/v1` ClusterPolicy CRD schema vendored in
   `tests/data/schemas/kyverno.io_clusterpolicy_v1.openapi.json` (a faithful hand-transcribed
   subset of Kyverno's CRD; see the `.SOURCE.md` beside it). The CRD's OpenAPI is turned into
   JSON Schema the way the API server reads it: objects with `properties` refuse unknown
   fields (kubectl's default strict field validation), `nullable`,
   `x-kubernetes-int-or-string` and `x-kubernetes-preserve-unknown-fields` are honoured.
   Broken policies (a wrong type, a bad enum, a misspelt field, a missing required field)
   must fail, so the check is not vacuous.
2. Behaviour: the CEL the policy carries (the webhook match condition, the rule's
   variables, expressions and message expressions) is evaluated with cel-python (`celpy`)
   against sample pods, with the variables Kyverno provides (`object`, `oldObject`,
   `request`, `variables`), evaluated the way Kyverno does: variables in order, every
   expression, a message expression only for a failed expression.

What this does NOT cover: a real Kyverno admission controller and API server. Not tested
here: Kyverno's own `match` logic (kinds, operations), its webhook registration and
`failurePolicy`, the API server's evaluation of `matchConditions`, the Kubernetes CEL type
checker and cost limits (cel-python is a different CEL implementation and does not type
check against the Pod schema), the CRD fields elided from the vendored schema, and Kyverno
version differences (`validate.failureAction` needs Kyverno >= 1.13). A Kyverno CLI
(`kyverno apply`/`kyverno test`) or chainsaw run against a kind cluster would cover these.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import celpy
import jsonschema
import pytest
import yaml
from celpy.adapter import json_to_cel

from contracts.admission.kyverno import (
    CAPACITY_TYPE_LABEL,
    RECLAIMABLE_TAINT_KEY,
    SERIAL_ANNOTATION,
    render_cluster_policy,
    render_cluster_policy_yaml,
)
from contracts.model import CONTRACT_LABEL, Contract
from tests.support.paths import DATA, REPO

EXAMPLES = REPO / "contracts" / "examples"
CRD_SCHEMA = DATA / "schemas" / "kyverno.io_clusterpolicy_v1.openapi.json"
SERIAL = 42


def load_contract(data: dict[str, Any]) -> Contract:
    return Contract.model_validate(data, strict=False)


def example_data(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    return data


@pytest.fixture(scope="module")
def contracts() -> list[Contract]:
    return [load_contract(yaml.safe_load(p.read_text())) for p in sorted(EXAMPLES.glob("*.yaml"))]


@pytest.fixture(scope="module")
def policy(contracts: list[Contract]) -> dict[str, Any]:
    return render_cluster_policy(contracts, serial=SERIAL)


# --- structure: the CRD schema -------------------------------------------------------------


def openapi_to_jsonschema(node: Any) -> Any:
    """A CRD `openAPIV3Schema` (OpenAPI subset + x-kubernetes-*) as JSON Schema 2020-12."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: openapi_to_jsonschema(value)
        for key, value in node.items()
        # Kubernetes markers and documentation carry no JSON Schema meaning.
        if not key.startswith("x-") and key not in {"nullable", "description"}
    }
    if "properties" in out:  # property names, not schemas, at this level
        out["properties"] = {k: openapi_to_jsonschema(v) for k, v in node["properties"].items()}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    # A structural schema knows every field of an object that lists its properties;
    # anything else is pruned by the API server or refused by strict field validation.
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = openapi_to_jsonschema(json.loads(CRD_SCHEMA.read_text()))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def schema_errors(validator: jsonschema.Draft202012Validator, doc: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


def test_policy_validates_against_the_kyverno_crd_schema(
    validator: jsonschema.Draft202012Validator, policy: dict[str, Any]
) -> None:
    assert schema_errors(validator, policy) == []
    assert policy["apiVersion"] == "kyverno.io/v1"
    assert policy["kind"] == "ClusterPolicy"


def test_policy_with_exemptions_and_empty_bundle_validate(
    validator: jsonschema.Draft202012Validator, contracts: list[Contract]
) -> None:
    exempt = render_cluster_policy(contracts, serial=SERIAL, exempt_namespaces=["kube-system"])
    assert schema_errors(validator, exempt) == []
    assert schema_errors(validator, render_cluster_policy([], serial=1)) == []


def _rule(p: dict[str, Any]) -> dict[str, Any]:
    rule: dict[str, Any] = p["spec"]["rules"][0]
    return rule


BREAKAGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "background is a string": lambda p: p["spec"].update(background="false"),
    "failureAction not an enum value": lambda p: _rule(p)["validate"].update(failureAction="Deny"),
    "misspelt spec field": lambda p: p["spec"].update(validationFailureActon="Enforce"),
    "unknown field in cel": lambda p: _rule(p)["validate"]["cel"].update(expression="true"),
    "rule without a name": lambda p: _rule(p).pop("name"),
    "rule without match": lambda p: _rule(p).pop("match"),
    "expression without expression": lambda p: _rule(p)["validate"]["cel"]["expressions"][0].pop(
        "expression"
    ),
    "operation not an enum value": lambda p: _rule(p)["match"]["any"][0]["resources"].update(
        operations=["CREAT"]
    ),
    "match with both any and all": lambda p: _rule(p)["match"].update(all=[]),
    "matchConditions not a list": lambda p: p["spec"]["webhookConfiguration"].update(
        matchConditions={"name": "x", "expression": "true"}
    ),
    "rule name too long": lambda p: _rule(p).update(name="r" * 64),
    "spec missing": lambda p: p.pop("spec"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_broken_policy_fails_schema_validation(
    validator: jsonschema.Draft202012Validator, policy: dict[str, Any], breakage: str
) -> None:
    broken = copy.deepcopy(policy)
    BREAKAGES[breakage](broken)
    assert schema_errors(validator, broken), f"{breakage}: schema accepted a broken policy"


def test_enforcement_settings(policy: dict[str, Any]) -> None:
    # A static guard: an Audit policy or an open webhook would let pods through unnoticed.
    spec = policy["spec"]
    assert spec["background"] is False
    assert spec["webhookConfiguration"]["failurePolicy"] == "Fail"
    rule = _rule(policy)
    assert rule["validate"]["failureAction"] == "Enforce"
    assert rule["match"] == {
        "any": [{"resources": {"kinds": ["Pod"], "operations": ["CREATE", "UPDATE"]}}]
    }
    assert policy["metadata"]["annotations"][SERIAL_ANNOTATION] == str(SERIAL)


# --- behaviour: the CEL, evaluated with cel-python -----------------------------------------

_ENV = celpy.Environment()


@cache
def _program(expression: str) -> Any:
    return _ENV.program(_ENV.compile(expression))


def cel(expression: str, activation: dict[str, Any]) -> Any:
    # cel-python raises on a CEL runtime error; Kyverno would report an error, never a pass.
    return _program(expression).evaluate(activation)


@dataclass(frozen=True)
class Decision:
    sent_to_kyverno: bool  # the webhook's matchConditions held
    failures: tuple[str, ...]  # messages of the failed validate.cel expressions

    @property
    def allowed(self) -> bool:
        return not self.sent_to_kyverno or not self.failures


def admit(
    policy: dict[str, Any],
    pod: dict[str, Any] | None,
    *,
    namespace: str,
    operation: str = "CREATE",
) -> Decision:
    request = {
        "operation": operation,
        "namespace": namespace,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": (pod or {}).get("metadata", {}).get("name", ""),
    }
    activation: dict[str, Any] = {
        "object": json_to_cel(pod),
        "oldObject": json_to_cel(pod if operation == "UPDATE" else None),
        "request": json_to_cel(request),
    }
    conditions = policy["spec"]["webhookConfiguration"]["matchConditions"]
    sent = all(bool(cel(c["expression"], activation)) for c in conditions)
    if pod is None:  # DELETE: nothing for the rule to look at
        return Decision(sent, ())

    cel_rule = _rule(policy)["validate"]["cel"]
    variables = celpy.celtypes.MapType()
    for variable in cel_rule["variables"]:  # in order: each may use the earlier ones
        value = cel(variable["expression"], {**activation, "variables": variables})
        variables[celpy.celtypes.StringType(variable["name"])] = value
    activation["variables"] = variables
    failures = []
    for check in cel_rule["expressions"]:
        if bool(cel(check["expression"], activation)):
            continue
        message = check.get("message", "")
        if "messageExpression" in check:
            message = str(cel(check["messageExpression"], activation))
        failures.append(message)
    # Kyverno may still see pods the match condition filtered out (older API servers
    # without matchConditions): the rule itself must then pass them too.
    assert sent or not failures, f"rule refuses a pod the match condition lets by: {failures}"
    return Decision(sent, tuple(failures))


def make_pod(
    namespace: str,
    *,
    labels: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    node_selector: dict[str, str] | None = None,
    affinity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.example/app:1"}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    if affinity is not None:
        spec["affinity"] = affinity
    metadata: dict[str, Any] = {"name": "p", "namespace": namespace}
    if labels is not None:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


RECLAIMABLE_TOLERATION = {
    "key": RECLAIMABLE_TAINT_KEY,
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}


def required_affinity(key: str, operator: str, values: list[str]) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": key, "operator": operator, "values": values}]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


# Every way a pod can be bound for reclaimable capacity.
BOUND: dict[str, dict[str, Any]] = {
    "tolerates the taint": {"tolerations": [RECLAIMABLE_TOLERATION]},
    "tolerates the taint key with Exists": {
        "tolerations": [{"key": RECLAIMABLE_TAINT_KEY, "operator": "Exists"}]
    },
    "tolerates everything": {"tolerations": [{"operator": "Exists"}]},
    "tolerates everything, empty key": {"tolerations": [{"key": "", "operator": "Exists"}]},
    "nodeSelector": {"node_selector": {CAPACITY_TYPE_LABEL: "reclaimable", "zone": "a"}},
    "required node affinity": {
        "affinity": required_affinity(CAPACITY_TYPE_LABEL, "In", ["committed", "reclaimable"])
    },
}

# Pods that look similar but cannot land on reclaimable nodes.
NOT_BOUND: dict[str, dict[str, Any]] = {
    "plain pod": {},
    "other taint tolerated": {
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
        ]
    },
    "nodeSelector for committed capacity": {"node_selector": {CAPACITY_TYPE_LABEL: "committed"}},
    "affinity for committed capacity": {
        "affinity": required_affinity(CAPACITY_TYPE_LABEL, "In", ["committed"])
    },
    "affinity avoiding reclaimable": {
        "affinity": required_affinity(CAPACITY_TYPE_LABEL, "NotIn", ["reclaimable"])
    },
    "empty affinity": {"affinity": {}},
}


@pytest.mark.parametrize("case", sorted(NOT_BOUND))
@pytest.mark.parametrize("labels", [None, {CONTRACT_LABEL: "no-such-contract"}])
def test_pod_not_bound_for_reclaimable_is_allowed_regardless(
    policy: dict[str, Any], case: str, labels: dict[str, str] | None
) -> None:
    decision = admit(
        policy, make_pod("default", labels=labels, **NOT_BOUND[case]), namespace="default"
    )
    assert decision == Decision(sent_to_kyverno=False, failures=())


@pytest.mark.parametrize("case", sorted(BOUND))
def test_bound_pod_without_contract_label_is_refused(policy: dict[str, Any], case: str) -> None:
    pod = make_pod("ci", labels={"app": "runner"}, **BOUND[case])
    decision = admit(policy, pod, namespace="ci")
    assert decision.sent_to_kyverno
    assert not decision.allowed
    assert len(decision.failures) == 1
    assert f"no {CONTRACT_LABEL} label" in decision.failures[0]


def test_bound_pod_with_empty_contract_label_is_refused(policy: dict[str, Any]) -> None:
    pod = make_pod("ci", labels={CONTRACT_LABEL: ""}, tolerations=[RECLAIMABLE_TOLERATION])
    decision = admit(policy, pod, namespace="ci")
    assert len(decision.failures) == 1
    assert f"no {CONTRACT_LABEL} label" in decision.failures[0]


@pytest.mark.parametrize("case", sorted(BOUND))
def test_unknown_contract_is_refused(policy: dict[str, Any], case: str) -> None:
    pod = make_pod("ci", labels={CONTRACT_LABEL: "ci-runner"}, **BOUND[case])
    decision = admit(policy, pod, namespace="ci")
    assert decision.failures == (
        f"{CONTRACT_LABEL} names unknown contract ci-runner"
        f" (not in contract bundle serial {SERIAL})",
    )


def test_right_contract_wrong_namespace_is_refused(policy: dict[str, Any]) -> None:
    labels = {CONTRACT_LABEL: "llm-train", "team": "ml-research"}
    pod = make_pod("default", labels=labels, tolerations=[RECLAIMABLE_TOLERATION])
    decision = admit(policy, pod, namespace="default")
    assert decision.failures == (
        "namespace or labels do not match contract llm-train: pod in namespace default,"
        " contract allows namespace training with labels team=ml-research",
    )


@pytest.mark.parametrize(
    "labels",
    [
        {CONTRACT_LABEL: "spark-etl"},  # selector label missing
        {CONTRACT_LABEL: "spark-etl", "app.kubernetes.io/component": "spark-driver"},  # wrong value
        {CONTRACT_LABEL: "spark-etl", "component": "spark-executor"},  # near-miss key
    ],
)
def test_missing_or_wrong_selector_label_is_refused(
    policy: dict[str, Any], labels: dict[str, str]
) -> None:
    pod = make_pod(
        "data-pipelines", labels=labels, node_selector={CAPACITY_TYPE_LABEL: "reclaimable"}
    )
    decision = admit(policy, pod, namespace="data-pipelines")
    assert len(decision.failures) == 1
    assert decision.failures[0].startswith("namespace or labels do not match contract spark-etl")


def test_request_namespace_is_authoritative(policy: dict[str, Any]) -> None:
    # The body claims the contract's namespace, the request creates it elsewhere.
    pod = make_pod(
        "ci", labels={CONTRACT_LABEL: "ci-runners"}, tolerations=[RECLAIMABLE_TOLERATION]
    )
    assert not admit(policy, pod, namespace="default").allowed
    assert admit(policy, pod, namespace="ci").allowed


VALID: list[tuple[str, dict[str, str]]] = [
    ("ci", {CONTRACT_LABEL: "ci-runners"}),
    ("training", {CONTRACT_LABEL: "llm-train", "team": "ml-research", "extra": "ok"}),
    ("search", {CONTRACT_LABEL: "search-api", "app": "search-api"}),
    (
        "data-pipelines",
        {CONTRACT_LABEL: "spark-etl", "app.kubernetes.io/component": "spark-executor"},
    ),
]


@pytest.mark.parametrize(("namespace", "labels"), VALID)
@pytest.mark.parametrize("case", sorted(BOUND))
def test_valid_contract_is_allowed(
    policy: dict[str, Any], namespace: str, labels: dict[str, str], case: str
) -> None:
    decision = admit(policy, make_pod(namespace, labels=labels, **BOUND[case]), namespace=namespace)
    assert decision == Decision(sent_to_kyverno=True, failures=())


def test_update_is_checked_too(policy: dict[str, Any]) -> None:
    pod = make_pod("ci", tolerations=[RECLAIMABLE_TOLERATION])
    assert not admit(policy, pod, namespace="ci", operation="UPDATE").allowed
    pod["metadata"]["labels"] = {CONTRACT_LABEL: "ci-runners"}
    assert admit(policy, pod, namespace="ci", operation="UPDATE").allowed


def test_delete_is_never_sent_to_kyverno(policy: dict[str, Any]) -> None:
    # `object` is null on DELETE: the match condition must be false, not a CEL error
    # (with failurePolicy Fail an error would refuse the deletion).
    assert admit(policy, None, namespace="ci", operation="DELETE") == Decision(False, ())


def two_selector_contract() -> Contract:
    data = example_data("llm-train")
    data["selectors"]["kubernetes"] = [
        {"namespace": "training", "labels": {"team": "ml-research"}},
        {"namespace": "research", "labels": {"team": "ml-research", "queue": "gpu"}},
    ]
    return load_contract(data)


@pytest.mark.parametrize(
    ("namespace", "labels", "allowed"),
    [
        ("training", {"team": "ml-research"}, True),  # first selector
        ("research", {"team": "ml-research", "queue": "gpu"}, True),  # second selector
        ("research", {"team": "ml-research"}, False),  # second namespace, first's labels
        ("training", {"queue": "gpu"}, False),
        ("elsewhere", {"team": "ml-research", "queue": "gpu"}, False),
    ],
)
def test_contract_with_two_kubernetes_selectors_matches_either(
    namespace: str, labels: dict[str, str], allowed: bool
) -> None:
    policy = render_cluster_policy([two_selector_contract()], serial=SERIAL)
    pod = make_pod(
        namespace,
        labels={CONTRACT_LABEL: "llm-train", **labels},
        tolerations=[{"operator": "Exists"}],
    )
    decision = admit(policy, pod, namespace=namespace)
    assert decision.allowed is allowed
    if not allowed:
        assert decision.failures == (
            f"namespace or labels do not match contract llm-train: pod in namespace {namespace},"
            " contract allows namespace training with labels team=ml-research"
            " or namespace research with labels queue=gpu,team=ml-research",
        )


def test_slurm_only_contract_admits_no_pod() -> None:
    data = example_data("ci-runners")
    data["selectors"].pop("kubernetes")
    policy = render_cluster_policy([load_contract(data)], serial=SERIAL)
    pod = make_pod(
        "ci", labels={CONTRACT_LABEL: "ci-runners"}, tolerations=[RECLAIMABLE_TOLERATION]
    )
    decision = admit(policy, pod, namespace="ci")
    assert decision.failures == (
        "namespace or labels do not match contract ci-runners: pod in namespace ci,"
        " contract allows no kubernetes selector",
    )


def test_empty_bundle_refuses_every_bound_pod_and_nothing_else() -> None:
    policy = render_cluster_policy([], serial=1)
    labels = {CONTRACT_LABEL: "ci-runners"}
    bound = make_pod("ci", labels=labels, tolerations=[RECLAIMABLE_TOLERATION])
    assert (
        admit(policy, bound, namespace="ci")
        .failures[0]
        .startswith(f"{CONTRACT_LABEL} names unknown contract ci-runners")
    )
    assert admit(policy, make_pod("ci", labels=labels), namespace="ci").allowed


def test_exempt_namespaces_skip_the_check(contracts: list[Contract]) -> None:
    policy = render_cluster_policy(contracts, serial=SERIAL, exempt_namespaces=["kube-system"])
    daemon = make_pod("kube-system", tolerations=[{"operator": "Exists"}])
    assert admit(policy, daemon, namespace="kube-system").allowed
    assert not admit(policy, daemon, namespace="ci").allowed


# --- rendering -----------------------------------------------------------------------------


def test_rendering_is_deterministic(contracts: list[Contract]) -> None:
    text = render_cluster_policy_yaml(contracts, serial=SERIAL)
    shuffled = list(contracts)
    random.Random(7).shuffle(shuffled)
    assert render_cluster_policy_yaml(shuffled, serial=SERIAL) == text
    assert render_cluster_policy_yaml(list(reversed(contracts)), serial=SERIAL) == text
    assert text.startswith(f"# Generated by SCO from contract bundle serial {SERIAL}.")


def test_yaml_is_the_policy(contracts: list[Contract], policy: dict[str, Any]) -> None:
    text = render_cluster_policy_yaml(contracts, serial=SERIAL)
    assert yaml.safe_load(text) == policy
    # The serial is in the annotation as a string (annotation values must be strings).
    assert f"{SERIAL_ANNOTATION}: '{SERIAL}'" in text


def test_serial_changes_only_serial_bearing_lines(contracts: list[Contract]) -> None:
    one = render_cluster_policy_yaml(contracts, serial=1).splitlines()
    two = render_cluster_policy_yaml(contracts, serial=2).splitlines()
    changed = [a for a, b in zip(one, two, strict=True) if a != b]
    assert changed and all("serial 1" in line or "'1'" in line for line in changed)


def test_invalid_inputs_are_refused(contracts: list[Contract]) -> None:
    with pytest.raises(ValueError, match="serial"):
        render_cluster_policy(contracts, serial=0)
    with pytest.raises(ValueError, match="duplicate"):
        render_cluster_policy([contracts[0], contracts[0]], serial=1)
    with pytest.raises(ValueError, match="CEL"):
        render_cluster_policy(contracts, serial=1, exempt_namespaces=["kube-system' || true"])
