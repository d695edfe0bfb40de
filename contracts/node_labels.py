"""The labels and taints a node SCO brings up joins its Kubernetes cluster with.

    sco.io/pool                  the pool id, e.g. r1.A.gp.l (a valid label value)
    sco.io/hall                  the hall, e.g. A
    sco.io/capacity-type         reclaimable | committed
    topology.kubernetes.io/zone  the hall again: a hall is an availability zone, and the
                                 well-known zone label is what topology spread and the
                                 deploy manifests' node affinity already use

A reclaimable node is tainted `sco.io/reclaimable=true:NoSchedule`: only pods that tolerate
it (or select `sco.io/capacity-type=reclaimable`) land there, and the Kyverno policy
(contracts/admission/kyverno.py, whose constants are reused here) admits such pods only
under a contract. Committed nodes take ordinary pods and carry no taint. The management
cluster's own nodes are labelled `sco.io/capacity-type=guaranteed` by whoever runs them
(see deploy/k8s/base); SCO never brings up such a node, so that value is refused here.

The node agent does not read these labels: it takes region and hall from its own config
(agent/config.py `hall`, the same hall letter), so both must be set from the same pool.

Pure, no I/O: stdlib plus the Kyverno module's constants. Part of the contract layer, so
it must not import ``workflows``, ``activities`` or ``workers``.
"""

from __future__ import annotations

import re

from contracts.admission.kyverno import CAPACITY_TYPE_LABEL, RECLAIMABLE, RECLAIMABLE_TAINT_KEY

POOL_LABEL = "sco.io/pool"
HALL_LABEL = "sco.io/hall"
ZONE_LABEL = "topology.kubernetes.io/zone"
COMMITTED = "committed"
CAPACITY_TYPES = (RECLAIMABLE, COMMITTED)
RECLAIMABLE_TAINT = f"{RECLAIMABLE_TAINT_KEY}=true:NoSchedule"

# A Kubernetes label value: at most 63 characters, alphanumeric at both ends.
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def _checked(what: str, value: str) -> str:
    if not _LABEL_VALUE.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not a valid Kubernetes label value")
    return value


def _capacity(capacity_type: str) -> str:
    if capacity_type not in CAPACITY_TYPES:
        raise ValueError(f"capacity type {capacity_type!r} is not one of {list(CAPACITY_TYPES)}")
    return capacity_type


def node_labels(pool_id: str, hall: str, capacity_type: str) -> dict[str, str]:
    return {
        POOL_LABEL: _checked("pool id", pool_id),
        HALL_LABEL: _checked("hall", hall),
        CAPACITY_TYPE_LABEL: _capacity(capacity_type),
        ZONE_LABEL: hall,
    }


def node_taints(capacity_type: str) -> list[str]:
    """Taints in kubelet's `key=value:Effect` form."""
    return [RECLAIMABLE_TAINT] if _capacity(capacity_type) == RECLAIMABLE else []


def kubelet_join_args(pool_id: str, hall: str, capacity_type: str) -> list[str]:
    """kubelet flags that register the node with its labels and taints from the start, so
    no pod can slip onto a reclaimable node before a later labelling step would taint it."""
    labels = node_labels(pool_id, hall, capacity_type)
    args = ["--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items())]
    taints = node_taints(capacity_type)
    if taints:
        args.append("--register-with-taints=" + ",".join(taints))
    return args
