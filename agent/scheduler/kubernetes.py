"""Kubernetes through the API server, the way `kubectl drain` does it, stdlib only.

cordon   PATCH /api/v1/nodes/<node> {"spec": {"unschedulable": true}} (strategic merge)
list     GET /api/v1/pods?fieldSelector=spec.nodeName=<node>; DaemonSet and mirror pods
         are left alone, as kubectl drain does
requeue  POST .../pods/<pod>/eviction (policy/v1): honours PodDisruptionBudgets;
         429 means a budget blocks it now (retryable), 404 that the pod is gone
force    DELETE .../pods/<pod> with gracePeriodSeconds=0

Authentication is the pod's service-account token (the agent runs as a DaemonSet or with a
node credential); HTTP calls run in a thread so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from agent.checkpoint import naming
from agent.scheduler import SchedulerError, Workload, pod_cgroup_markers

log = logging.getLogger(__name__)


def _runs_as(spec: dict[str, Any]) -> tuple[int | None, int | None]:
    """The uid and gid every container of the pod runs as, from its securityContexts (a
    container's own over the pod's); None when they differ or the pod does not say (the
    image's user, which the API does not know). A pod without a declared runAsUser gets no
    checkpoint directory: declare one for checkpoint and decommission contracts."""
    pod_ctx = spec.get("securityContext") or {}
    uids, gids = set(), set()
    for container in spec.get("containers") or []:
        ctx = container.get("securityContext") or {}
        uids.add(ctx.get("runAsUser", pod_ctx.get("runAsUser")))
        gids.add(ctx.get("runAsGroup", pod_ctx.get("runAsGroup")))

    def one(values: set[Any]) -> int | None:
        if len(values) != 1:
            return None
        [value] = values
        valid = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return value if valid else None

    return one(uids), one(gids)


class KubernetesScheduler:
    kind = "kubernetes"

    def __init__(
        self,
        api_url: str,
        *,
        dry_run: bool,
        token_path: Path | None = None,
        ca_path: Path | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.dry_run = dry_run
        self._base = api_url.rstrip("/")
        self._token_path = token_path
        self._timeout = timeout
        self._ssl: ssl.SSLContext | None = None
        if self._base.startswith("https"):
            self._ssl = ssl.create_default_context(cafile=str(ca_path) if ca_path else None)

    def _call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        headers = {"Accept": "application/json"}
        if self._token_path is not None and self._token_path.is_file():
            # Re-read every call: projected service-account tokens rotate.
            headers["Authorization"] = f"Bearer {self._token_path.read_text().strip()}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self._base + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self._timeout, context=self._ssl) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise SchedulerError(
                f"{method} {path}: HTTP {exc.code}: {detail}",
                not_found=exc.code == 404,
                retryable=exc.code in (409, 429) or exc.code >= 500,
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise SchedulerError(f"{method} {path}: {exc}", retryable=True) from exc
        return json.loads(raw) if raw else None

    async def _acall(self, method: str, path: str, body: Any = None, ctype: str = "") -> Any:
        return await asyncio.to_thread(self._call, method, path, body, ctype or "application/json")

    async def cordon(self, node: str, reason: str) -> None:
        path = f"/api/v1/nodes/{urllib.parse.quote(node)}"
        if self.dry_run:
            log.info("dry-run: would PATCH %s unschedulable=true (%s)", path, reason)
            return
        body = {"spec": {"unschedulable": True}}
        await self._acall("PATCH", path, body, "application/strategic-merge-patch+json")

    async def workloads(self, node: str) -> list[Workload]:
        query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node}"})
        doc = await self._acall("GET", f"/api/v1/pods?{query}")
        found = []
        for pod in (doc or {}).get("items", []):
            meta = pod.get("metadata", {})
            phase = pod.get("status", {}).get("phase", "")
            if phase in ("Succeeded", "Failed"):
                continue
            owners = meta.get("ownerReferences") or []
            if any(o.get("kind") == "DaemonSet" for o in owners):
                continue  # a DaemonSet pod comes straight back: kubectl drain skips it too
            if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
                continue  # static pods cannot be evicted through the API
            ns, name = meta.get("namespace", "default"), meta.get("name", "")
            uid, gid = _runs_as(pod.get("spec") or {})
            found.append(
                Workload(
                    id=f"{ns}/{name}",
                    socket_name=naming.pod(ns, name),
                    namespace=ns,
                    labels=dict(meta.get("labels") or {}),
                    uid=uid,
                    gid=gid,
                    # Never empty for a pod: an empty marker would match any cgroup.
                    cgroup_markers=pod_cgroup_markers(str(meta.get("uid") or f"?{ns}/{name}")),
                )
            )
        return found

    def _pod_path(self, workload: Workload) -> str:
        ns, name = workload.id.split("/", 1)
        return f"/api/v1/namespaces/{urllib.parse.quote(ns)}/pods/{urllib.parse.quote(name)}"

    async def requeue(self, workload: Workload, grace_seconds: int) -> None:
        path = self._pod_path(workload) + "/eviction"
        if self.dry_run:
            log.info("dry-run: would POST %s", path)
            return
        ns, name = workload.id.split("/", 1)
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"gracePeriodSeconds": grace_seconds},
        }
        await self._acall("POST", path, body)

    async def force(self, workload: Workload) -> None:
        path = self._pod_path(workload)
        if self.dry_run:
            log.info("dry-run: would DELETE %s with gracePeriodSeconds=0", path)
            return
        try:
            await self._acall("DELETE", path, {"gracePeriodSeconds": 0})
        except SchedulerError as exc:
            if not exc.not_found:
                raise
