"""Kubernetes demand: the pods the scheduler could not place, read with the official client.

A pod counts when the API server lists it as Pending, it has no node, it is not being
deleted and its PodScheduled condition is False with reason Unschedulable: the scheduler
tried and found no room. Pods still waiting for a first scheduling attempt, held back by
scheduling gates (reason SchedulingGated) or already bound and pulling images do not count;
more capacity would not help them.

A pod's size is what the scheduler reserves for it: per dimension the larger of its
containers' sum and its biggest init container (native sidecars, init containers with
restartPolicy Always, run beside everything after them), plus the RuntimeClass overhead.
A request falls back to the limit when only a limit is set, as the API server defaults it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from dataclasses import dataclass
from decimal import Decimal

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client import ApiClient, CoreV1Api, V1Container, V1Pod, V1PodList, V1PodSpec
from kubernetes.client.exceptions import ApiException

from activities.demand.model import PendingWork, Scheduler
from activities.demand.source import SourceUnavailable
from contracts.model import CONTRACT_LABEL

log = logging.getLogger(__name__)

SOURCE = "kubernetes"
PENDING = "status.phase=Pending"
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")

# Kubernetes' quantity grammar: a decimal number, then a binary-SI suffix, a decimal-SI
# suffix or a decimal exponent. "E" alone is exa; "e"/"E" followed by digits an exponent.
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}  # powers of 1024
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_GIB = Decimal(2**30)


def quantity(q: str) -> Decimal:
    """A Kubernetes resource quantity ("500m", "1.5Gi", "1e9") as an exact number."""
    match = _QUANTITY.fullmatch(q)
    if match is None:
        raise ValueError(f"bad quantity {q!r}")
    exponent = match["exponent"]
    if exponent is not None and abs(int(exponent)) > 30:
        raise ValueError(f"bad quantity {q!r}: exponent out of range")
    suffix = match["suffix"]
    value = Decimal(match["number"])
    if suffix in _BINARY:
        value *= Decimal(1024) ** _BINARY[suffix]
    elif suffix is not None:
        value = value.scaleb(_DECIMAL[suffix])
    elif exponent is not None:
        value = value.scaleb(int(exponent))
    if value < 0:
        raise ValueError(f"bad quantity {q!r}: negative")
    return value


def cpu_cores(q: str) -> float:
    return float(quantity(q))


def memory_gib(q: str) -> float:
    return float(quantity(q) / _GIB)


def device_count(q: str) -> int:
    """Extended resources such as GPUs come only in whole numbers."""
    value = quantity(q)
    if value != value.to_integral_value():
        raise ValueError(f"bad quantity {q!r}: devices come in whole numbers")
    return int(value)


@dataclass(frozen=True)
class Request:
    vcpu: float = 0.0
    memory_gib: float = 0.0
    gpus: int = 0

    def __add__(self, other: Request) -> Request:
        return Request(
            self.vcpu + other.vcpu, self.memory_gib + other.memory_gib, self.gpus + other.gpus
        )

    def max(self, other: Request) -> Request:
        return Request(
            max(self.vcpu, other.vcpu),
            max(self.memory_gib, other.memory_gib),
            max(self.gpus, other.gpus),
        )


def _parse(values: dict[str, tuple[str, str]], where: str) -> Request:
    """`values`: resource name -> (field it came from, quantity); errors name the field."""
    out = Request()
    for name, (field, q) in values.items():
        try:
            if name == "cpu":
                out = out + Request(vcpu=cpu_cores(q))
            elif name == "memory":
                out = out + Request(memory_gib=memory_gib(q))
            elif name in GPU_RESOURCES:
                out = out + Request(gpus=device_count(q))
        except ValueError as exc:
            raise ValueError(f"{where}.{field}[{name}]: {exc}") from exc
    return out


def container_request(container: V1Container, where: str) -> Request:
    resources = container.resources
    if resources is None:
        return Request()
    # The API server copies a limit into an absent request, resource by resource.
    values = {k: ("resources.limits", v) for k, v in (resources.limits or {}).items()}
    values.update({k: ("resources.requests", v) for k, v in (resources.requests or {}).items()})
    return _parse(values, f"{where}[{container.name}]")


def pod_request(spec: V1PodSpec) -> Request:
    """What the scheduler reserves for the pod (Kubernetes' PodRequests, same rules)."""
    total = Request()
    for c in spec.containers:
        total = total + container_request(c, "spec.containers")
    sidecars = Request()  # restartable init containers started so far keep running
    init_peak = Request()
    for c in spec.init_containers or []:
        req = container_request(c, "spec.initContainers")
        if c.restart_policy == "Always":
            sidecars = sidecars + req
            init_peak = init_peak.max(sidecars)
        else:
            init_peak = init_peak.max(req + sidecars)
    total = (total + sidecars).max(init_peak)
    overhead = {k: ("overhead", v) for k, v in (spec.overhead or {}).items()}
    return total + _parse(overhead, "spec")


def is_unschedulable(pod: V1Pod) -> bool:
    meta, spec, status = pod.metadata, pod.spec, pod.status
    if meta is not None and meta.deletion_timestamp is not None:
        return False  # going away: its request is not demand
    if spec is None or spec.node_name or status is None or status.phase != "Pending":
        return False
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in status.conditions or []
    )


def pod_ref(pod: V1Pod) -> str:
    meta = pod.metadata
    return f"{meta.namespace if meta else ''}/{meta.name if meta else ''}"


def pod_work(pod: V1Pod) -> PendingWork:
    """The pod as pending work; ValueError naming the field when a quantity is bad."""
    assert pod.spec is not None  # is_unschedulable checked it
    labels = dict((pod.metadata.labels if pod.metadata else None) or {})
    req = pod_request(pod.spec)
    return PendingWork(
        scheduler=Scheduler.KUBERNETES,
        ref=pod_ref(pod),
        contract=labels.get(CONTRACT_LABEL),
        namespace=(pod.metadata.namespace if pod.metadata else None) or "",
        labels=labels,
        vcpu=req.vcpu,
        memory_gib=req.memory_gib,
        gpus=req.gpus,
    )


def _short(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _api_reason(exc: ApiException) -> str:
    reason = f"HTTP {exc.status} {exc.reason or ''}".rstrip()
    try:
        # The API server explains itself in a Status object: keep its message.
        message = json.loads(exc.body or "").get("message", "")
    except (ValueError, AttributeError):
        message = ""
    return _short(f"{reason}: {message}" if message else reason)


def _transport_reason(exc: urllib3.exceptions.HTTPError) -> str:
    # MaxRetryError's own text repeats the URL and pool; the cause is what matters.
    cause = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
    return _short(f"request to the API server failed: {cause}")


class KubernetesPendingPods:
    """DemandSource: unschedulable pods, cluster-wide or in `namespaces` only."""

    name = SOURCE

    def __init__(
        self,
        api: ApiClient,
        namespaces: list[str] | None = None,
        *,
        request_timeout: float = 10,
        page_size: int = 500,
    ) -> None:
        # Checked here: the client would refuse them on every read, as if the server had.
        if request_timeout <= 0 or page_size < 1:
            raise ValueError("request_timeout must be > 0 and page_size >= 1")
        self._core = CoreV1Api(api)
        # An empty list means cluster-wide: listing no namespace would report zero demand.
        self._namespaces = namespaces or None
        # Bounds each HTTP attempt; urllib3 may retry a failed connection or read.
        self._timeout = request_timeout
        self._page_size = page_size

    async def pending(self) -> list[PendingWork]:
        pods = await asyncio.to_thread(self._list_pending)
        works = []
        for pod in pods:
            if not is_unschedulable(pod):
                continue
            try:
                works.append(pod_work(pod))
            except ValueError as exc:
                # One bad pod must not blind the intake to every other pod.
                log.warning("kubernetes: skipping pod %s: %s", pod_ref(pod), exc)
        return works

    def _list_pending(self) -> list[V1Pod]:
        try:
            pods: list[V1Pod] = []
            scopes: list[str | None] = [*self._namespaces] if self._namespaces else [None]
            for namespace in scopes:
                pods += self._list_pages(namespace)
            return pods
        except ApiException as exc:
            raise SourceUnavailable(SOURCE, _api_reason(exc)) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise SourceUnavailable(SOURCE, _transport_reason(exc)) from exc
        except OSError as exc:
            raise SourceUnavailable(SOURCE, _short(f"cannot reach the API server: {exc}")) from exc
        except (ValueError, TypeError) as exc:
            # Not JSON, or JSON that is no PodList (pydantic's ValidationError is a ValueError).
            raise SourceUnavailable(SOURCE, _short(f"malformed answer: {exc}")) from exc

    def _list_pages(self, namespace: str | None) -> list[V1Pod]:
        pods: list[V1Pod] = []
        token: str | None = None
        while True:
            page = self._page(namespace, token)
            pods += page.items
            following = page.metadata._continue if page.metadata else None
            if not following:
                return pods
            if following == token:
                raise ValueError(f"the server repeated continue token {token!r}")
            token = following

    def _page(self, namespace: str | None, token: str | None) -> V1PodList:
        # The field selector is evaluated by the API server: only Pending pods travel.
        if namespace is None:
            return self._core.list_pod_for_all_namespaces(
                field_selector=PENDING,
                limit=self._page_size,
                _continue=token,
                _request_timeout=self._timeout,
            )
        return self._core.list_namespaced_pod(
            namespace,
            field_selector=PENDING,
            limit=self._page_size,
            _continue=token,
            _request_timeout=self._timeout,
        )


def api_client_from_kubeconfig(path: str | None, context: str | None = None) -> ApiClient:
    """A client for the kubeconfig at `path` (its `context`, else the current one).

    Without a path, inside a pod (KUBERNETES_SERVICE_HOST set), the pod's service account;
    otherwise the client's default ($KUBECONFIG, then ~/.kube/config). The file is never
    written back (persist_config=False): refreshed credentials stay in memory.
    """
    if path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = client.Configuration()
        try:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except (config.ConfigException, OSError) as exc:
            raise SourceUnavailable(SOURCE, f"in-cluster config: {exc}") from exc
        return ApiClient(configuration)
    where = path if path is not None else "default kubeconfig ($KUBECONFIG or ~/.kube/config)"
    if path is not None and os.pathsep not in path and not os.path.isfile(path):
        # The client would skip a missing file and complain of an empty config instead.
        raise SourceUnavailable(SOURCE, f"kubeconfig {path}: no such file")
    try:
        # Like load_incluster_config above, untyped in the client: it returns an ApiClient.
        api: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, persist_config=False
        )
    except (config.ConfigException, OSError, ValueError, yaml.YAMLError) as exc:
        raise SourceUnavailable(SOURCE, _short(f"kubeconfig {where}: {exc}")) from exc
    return api
