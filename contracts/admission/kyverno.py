"""Kubernetes admission: a Kyverno ClusterPolicy rendered from the signed contract bundle.

A pod is *bound for reclaimable capacity* when it tolerates the reclaimable taint
(`sco.io/reclaimable=true:NoSchedule`, or everything through an `operator: Exists`
toleration without a key) or requires the node label `sco.io/capacity-type: reclaimable`
through `nodeSelector` or required node affinity. Such a pod is admitted only when its
`sco.io/contract` label names a contract of the bundle and one of that contract's
kubernetes selectors matches: same namespace, and the pod carries every selector label.
Every other pod is left alone.

The rule is Kyverno's `validate.cel`: the contracts are compiled into CEL literals, so the
policy needs nothing at admission time (no API call, no ConfigMap, no control plane), and
the exact expressions Kyverno runs can be evaluated in tests with cel-python.

Targets: Kyverno >= 1.13 (rule-level `validate.failureAction`; older versions would drop it
and silently run the rule in Audit mode) and Kubernetes >= 1.28 (webhook `matchConditions`).

This module is part of the contract layer: it must not import ``workflows``,
``activities`` or ``workers``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import yaml

from contracts.model import CONTRACT_LABEL, Contract, KubernetesSelector

__all__ = [
    "CAPACITY_TYPE_LABEL",
    "POLICY_NAME",
    "RECLAIMABLE",
    "RECLAIMABLE_TAINT_KEY",
    "SERIAL_ANNOTATION",
    "render_cluster_policy",
    "render_cluster_policy_yaml",
]

# Node naming shared with the node agent and the node labeller.
CAPACITY_TYPE_LABEL = "sco.io/capacity-type"
RECLAIMABLE = "reclaimable"
RECLAIMABLE_TAINT_KEY = "sco.io/reclaimable"  # taint sco.io/reclaimable=true:NoSchedule

POLICY_NAME = "sco-reclaimable-contracts"
RULE_NAME = "contract-for-reclaimable-capacity"
SERIAL_ANNOTATION = "sco.io/bundle-serial"

# Contract names, namespaces and label keys/values are already restricted by the model to
# these characters (plus the punctuation of our own messages); anything else, quotes and
# backslashes above all, would need CEL escaping, so it is refused instead.
_CEL_SAFE = re.compile(r"[A-Za-z0-9_./=, -]*")


def _cel(text: str) -> str:
    """A CEL string literal for `text`."""
    if not _CEL_SAFE.fullmatch(text):
        raise ValueError(f"refusing to embed {text!r} in a CEL expression")
    return f"'{text}'"


# "Bound for reclaimable capacity". `has()` guards every optional field: a CEL runtime
# error would make Kyverno report an error instead of a clean pass for ordinary pods.
# An Exists toleration with no key tolerates every taint, ours included. In JSON an empty
# key is usually omitted, hence both `!has(t.key)` and `t.key == ''`.
_TOLERATES = (
    "(has(object.spec.tolerations) && object.spec.tolerations.exists(t,\n"
    f"  (has(t.key) && t.key == {_cel(RECLAIMABLE_TAINT_KEY)}) ||\n"
    "  ((!has(t.key) || t.key == '') && has(t.operator) && t.operator == 'Exists')))"
)
_NODE_SELECTOR = (
    "(has(object.spec.nodeSelector) &&\n"
    f"  {_cel(CAPACITY_TYPE_LABEL)} in object.spec.nodeSelector &&\n"
    f"  object.spec.nodeSelector[{_cel(CAPACITY_TYPE_LABEL)}] == {_cel(RECLAIMABLE)})"
)
# Terms of required node affinity are ORed: one term asking for reclaimable nodes is
# enough for the pod to land there.
_NODE_AFFINITY = (
    "(has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) &&\n"
    "  has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) &&\n"
    "  has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms) &&\n"
    "  object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms.exists(term,\n"
    "    has(term.matchExpressions) && term.matchExpressions.exists(e,\n"
    f"      e.key == {_cel(CAPACITY_TYPE_LABEL)} && e.operator == 'In' &&\n"
    f"      has(e.values) && {_cel(RECLAIMABLE)} in e.values)))"
)
BOUND_FOR_RECLAIMABLE = (
    f"has(object.spec) && (\n{_TOLERATES} ||\n{_NODE_SELECTOR} ||\n{_NODE_AFFINITY})"
)


def _selector_clause(selector: KubernetesSelector) -> str:
    # `key in map` first: indexing a missing key is a CEL runtime error.
    parts = [f"variables.namespace == {_cel(selector.namespace)}"]
    parts += [
        f"{_cel(key)} in variables.labels && variables.labels[{_cel(key)}] == {_cel(value)}"
        for key, value in sorted(selector.labels.items())
    ]
    return "(" + " && ".join(parts) + ")"


def _matches_contract(contracts: Sequence[Contract]) -> str:
    clauses = [
        f"(variables.contract == {_cel(c.name)} && (\n  "
        + " ||\n  ".join(_selector_clause(s) for s in c.selectors.kubernetes)
        + "))"
        for c in contracts
        if c.selectors.kubernetes  # a Slurm-only contract matches no pod
    ]
    return " ||\n".join(clauses) or "false"


def _describe(contract: Contract) -> str:
    selectors = [
        f"namespace {s.namespace}"
        + (
            " with labels " + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            if s.labels
            else ""
        )
        for s in contract.selectors.kubernetes
    ]
    return " or ".join(selectors) or "no kubernetes selector"


def _allowed_map(contracts: Sequence[Contract]) -> str:
    # A map of strings only: Kubernetes' CEL refuses mixed-type aggregate literals.
    entries = ",\n  ".join(f"{_cel(c.name)}: {_cel(_describe(c))}" for c in contracts)
    return "{\n  " + entries + "}" if entries else "{}"


def _variables(
    contracts: Sequence[Contract], exempt_namespaces: Sequence[str]
) -> list[dict[str, str]]:
    needs_contract = "variables.boundForReclaimable"
    if exempt_namespaces:
        exempt = ", ".join(_cel(ns) for ns in sorted(set(exempt_namespaces)))
        needs_contract += f" && !(variables.namespace in [{exempt}])"
    names = ", ".join(_cel(c.name) for c in contracts)
    return [
        {"name": "boundForReclaimable", "expression": BOUND_FOR_RECLAIMABLE},
        # The request's namespace is where the pod is being created, whatever its body says.
        {"name": "namespace", "expression": "request.namespace"},
        {"name": "needsContract", "expression": needs_contract},
        {
            "name": "labels",
            "expression": "has(object.metadata.labels) ? object.metadata.labels : {}",
        },
        {
            "name": "contract",
            "expression": f"{_cel(CONTRACT_LABEL)} in variables.labels"
            f" ? variables.labels[{_cel(CONTRACT_LABEL)}] : ''",
        },
        {"name": "knownContracts", "expression": f"[{names}]"},
        {"name": "matchesContract", "expression": _matches_contract(contracts)},
        # Only for the refusal message: what each contract would have accepted.
        {"name": "allowedSelectors", "expression": _allowed_map(contracts)},
    ]


def _expressions(serial: int) -> list[dict[str, str]]:
    # One expression per refusal reason; each passes whenever an earlier one already
    # fails, so a refused pod gets exactly one message (Kyverno reports every failure).
    bound = (
        f"tolerates taint {RECLAIMABLE_TAINT_KEY} or selects {CAPACITY_TYPE_LABEL}={RECLAIMABLE}"
    )
    return [
        {
            "expression": "!variables.needsContract || variables.contract != ''",
            "message": f"pod {bound} but has no {CONTRACT_LABEL} label naming its contract",
        },
        {
            "expression": "!variables.needsContract || variables.contract == '' ||\n"
            "  variables.contract in variables.knownContracts",
            "message": f"{CONTRACT_LABEL} names an unknown contract (bundle serial {serial})",
            "messageExpression": f"'{CONTRACT_LABEL} names unknown contract ' + variables.contract"
            f" + ' (not in contract bundle serial {serial})'",
        },
        {
            "expression": "!variables.needsContract ||\n"
            "  !(variables.contract in variables.knownContracts) ||\n"
            "  variables.matchesContract",
            "message": f"namespace or labels do not match the contract named by {CONTRACT_LABEL}",
            "messageExpression": "'namespace or labels do not match contract ' + variables.contract"
            " + ': pod in namespace ' + variables.namespace + ', contract allows '"
            " + variables.allowedSelectors[variables.contract]",
        },
    ]


def render_cluster_policy(
    contracts: Sequence[Contract], *, serial: int, exempt_namespaces: Sequence[str] = ()
) -> dict[str, Any]:
    """The ClusterPolicy (as a plain dict) admitting reclaimable pods per `contracts`.

    `serial` is the bundle's serial, carried in the `sco.io/bundle-serial` annotation and
    in refusal messages. `exempt_namespaces` are never checked: cluster DaemonSets (CNI,
    kube-proxy) tolerate every taint and would otherwise be refused on every node.
    Same input, same output: contracts are ordered by name.
    """
    if serial < 1:
        raise ValueError(f"bundle serial must be >= 1, got {serial}")
    ordered = sorted(contracts, key=lambda c: c.name)
    names = [c.name for c in ordered]
    if len(set(names)) != len(names):
        raise ValueError("duplicate contract names in the bundle")
    return {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {
            "name": POLICY_NAME,
            "labels": {"app.kubernetes.io/managed-by": "sco"},
            "annotations": {
                SERIAL_ANNOTATION: str(serial),
                "policies.kyverno.io/title": "SCO: contracts for reclaimable capacity",
                "policies.kyverno.io/subject": "Pod",
                # Pods are what lands on nodes, and every controller's pods pass through
                # admission. Kyverno's rewrite of CEL rules for Deployments, Jobs, ... is
                # not something this policy is tested against, so it is switched off.
                "pod-policies.kyverno.io/autogen-controllers": "none",
            },
        },
        "spec": {
            "admission": True,
            # Admission only: a background scan has no `request`, and pods already
            # running are the node agent's business, not this policy's.
            "background": False,
            "webhookConfiguration": {
                # Fail closed, but only for pods bound for reclaimable capacity: the API
                # server evaluates the match condition itself, so an unavailable Kyverno
                # blocks those pods and nothing else.
                "failurePolicy": "Fail",
                "matchConditions": [
                    {
                        "name": "bound-for-reclaimable-capacity",
                        "expression": "request.operation in ['CREATE', 'UPDATE'] &&\n"
                        + BOUND_FOR_RECLAIMABLE,
                    }
                ],
            },
            "rules": [
                {
                    "name": RULE_NAME,
                    "match": {
                        "any": [
                            {"resources": {"kinds": ["Pod"], "operations": ["CREATE", "UPDATE"]}}
                        ]
                    },
                    "validate": {
                        "failureAction": "Enforce",
                        "cel": {
                            "variables": _variables(ordered, exempt_namespaces),
                            "expressions": _expressions(serial),
                        },
                    },
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """CEL (multi-line, or quoting strings) as literal blocks, so reviewers read it as is."""


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    literal = "\n" in data or "'" in data
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if literal else None)


_Dumper.add_representer(str, _represent_str)


def render_cluster_policy_yaml(
    contracts: Sequence[Contract], *, serial: int, exempt_namespaces: Sequence[str] = ()
) -> str:
    """:func:`render_cluster_policy` as a YAML manifest, ready for `kubectl apply -f`."""
    policy = render_cluster_policy(contracts, serial=serial, exempt_namespaces=exempt_namespaces)
    body = yaml.dump(policy, Dumper=_Dumper, sort_keys=False, width=4096, allow_unicode=True)
    return f"# Generated by SCO from contract bundle serial {serial}. Do not edit.\n{body}"
