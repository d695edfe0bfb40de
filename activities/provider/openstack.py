"""The CloudProvider on a real OpenStack, through openstacksdk.

- Configuration is the standard one (`clouds.yaml`, `OS_CLOUD`, `OS_*`): one cloud per
  region, named by the settings.
- A hall is an availability zone; a SKU x size is a flavor named `<sku>.<size>`.
- Bare-metal SKUs go through Nova as well, with flavors whose resource class is the SKU's
  Ironic nodes (Nova's Ironic driver): one API, one idempotency rule, one quota for both.
- Idempotent create: the deterministic name plus SCO metadata is looked up before every
  create, so a retried activity finds the server of the first attempt.
- Committed capacity is Blazar instance reservations, through openstacksdk's generic
  `reservation` proxy on the v1 API (clouds.yaml `reservation_api_version: "1"`).
  openstacksdk has no Blazar resource classes, but its proxy is an authenticated
  keystoneauth adapter with the catalog's endpoint; python-blazarclient would add a
  second client stack (and OSC plugin noise) for six REST calls.

openstacksdk is synchronous: every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import openstack
from keystoneauth1 import exceptions as ks_exc
from openstack import exceptions as os_exc
from openstack.connection import Connection

from activities.provider.errors import (
    InsufficientCapacity,
    NotFound,
    Permanent,
    ProviderError,
    RateLimited,
    Transient,
)
from activities.provider.interface import (
    OWNER_KEY,
    CreateRequest,
    InstanceStatus,
    ProviderInstance,
    ReclaimDecision,
    Reservation,
    ReservationRequest,
)
from activities.provider.leases import check_lease_name, lease_prefix, parse_lease_name
from contracts.pool_id import PoolId

T = TypeVar("T")
POOL_KEY = "sco-pool"
CAPACITY_KEY = "sco-capacity"  # reclaimable | committed
_BLAZAR_TIME = "%Y-%m-%d %H:%M"


def translate(exc: Exception) -> ProviderError:
    """openstacksdk / keystoneauth errors → our typed errors."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, os_exc.ResourceNotFound | os_exc.NotFoundException):
        return NotFound(str(exc))
    if isinstance(exc, os_exc.HttpException):
        code = exc.status_code or 0
        text = f"{exc.details or ''} {exc}"
        if code == 404:  # a bare HttpException (our Blazar calls) is not a NotFoundException
            return NotFound(str(exc))
        if code == 429:
            retry = exc.response.headers.get("Retry-After") if exc.response is not None else None
            return RateLimited(str(exc), float(retry) if retry and retry.isdigit() else None)
        if code == 403 and "Quota exceeded" in text:
            return InsufficientCapacity(f"quota exhausted: {exc}")
        if "No valid host" in text:
            return InsufficientCapacity(str(exc))
        if code >= 500:
            return Transient(str(exc))
        return Permanent(str(exc))
    if isinstance(
        exc, ks_exc.ConnectFailure | ks_exc.ConnectTimeout | ks_exc.RetriableConnectionFailure
    ):
        return Transient(f"cannot reach OpenStack: {exc}")
    if isinstance(exc, ks_exc.Unauthorized | ks_exc.AuthorizationFailure):
        return Permanent(f"authentication failed: {exc}")
    return Transient(f"{type(exc).__name__}: {exc}")


def _free(inventories: dict[str, Any], usages: dict[str, int], resource: str) -> float:
    """Free amount of a Placement resource class on one provider."""
    inv = inventories.get(resource)
    if inv is None:
        return 0.0
    capacity = (inv["total"] - inv.get("reserved", 0)) * inv.get("allocation_ratio", 1.0)
    return float(capacity - usages.get(resource, 0))


def _status(server: Any) -> InstanceStatus:
    status = str(server.status or "").upper()
    if status in ("ACTIVE", "ERROR", "DELETED"):
        return InstanceStatus(status)
    return InstanceStatus.BUILD


def _nova_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def _blazar_time(text: str) -> datetime:
    return datetime.strptime(text[:16].replace("T", " "), _BLAZAR_TIME).replace(tzinfo=UTC)


class OpenStackProvider:
    def __init__(
        self,
        conn: Connection,
        *,
        image: str = "sco-node",
        network: str = "none",
        hall_property: str | None = "hall",
    ) -> None:
        self._conn = conn
        self._image = image
        self._network = network
        self._hall_property = hall_property
        self._image_id: str | None = None
        self._decided: set[str] = set()

    @property
    def connection(self) -> Connection:
        return self._conn

    @classmethod
    def from_cloud(cls, cloud: str, **kwargs: Any) -> OpenStackProvider:
        return cls(openstack.connect(cloud=cloud), **kwargs)

    async def close(self) -> None:
        """Close the SDK connection's HTTP sessions (the process is stopping)."""
        await asyncio.to_thread(self._conn.close)

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(fn)
        except Exception as exc:
            raise translate(exc) from exc

    def _view(self, server: Any) -> ProviderInstance:
        meta = dict(server.metadata or {})
        return ProviderInstance(
            provider_id=server.id,
            name=server.name,
            pool_id=meta.get(POOL_KEY, ""),
            hall=server.availability_zone or "",
            status=_status(server),
            metadata=meta,
            host=server.compute_host,
            created_at=_nova_time(server.created_at),
        )

    def _owned_named(self, name: str, region: str) -> list[Any]:
        """SCO's servers of one name, the one to keep first: the oldest, then by id, so
        racing creators agree on it."""
        pattern = f"^{re.escape(name)}$"
        found = [
            s
            for s in self._conn.compute.servers(details=True, name=pattern)
            if (s.metadata or {}).get(OWNER_KEY) == region and s.name == name
        ]
        return sorted(found, key=lambda s: (str(s.created_at or ""), str(s.id)))

    def _dedupe(self, name: str, region: str) -> Any | None:
        """The server to keep for one name; duplicates (a lost create that landed beside
        its retry) are deleted."""
        found = self._owned_named(name, region)
        for extra in found[1:]:
            self._conn.compute.delete_server(extra.id, ignore_missing=True)
        return found[0] if found else None

    def _image_ref(self) -> str:
        if self._image_id is None:
            image = self._conn.image.find_image(self._image, ignore_missing=False)
            self._image_id = image.id
        return self._image_id

    async def create(self, request: CreateRequest) -> ProviderInstance:
        def go() -> Any:
            existing = self._dedupe(request.name, request.region)
            if existing is not None:  # a retry after a lost response
                return existing
            kwargs: dict[str, Any] = {}
            if request.reservation_id is not None:
                # An instance reservation is booted through the flavor Blazar made for it;
                # the `reservation` scheduler hint is for host reservations only.
                flavor_id = self._reservation_flavor(request.reservation_id)
            else:
                flavor_id = self._conn.compute.find_flavor(request.flavor, ignore_missing=False).id
            kwargs["availability_zone"] = request.hall
            if request.user_data:
                kwargs["user_data"] = base64.b64encode(request.user_data.encode()).decode()
            made = self._conn.compute.create_server(
                name=request.name,
                flavor_id=flavor_id,
                image_id=self._image_ref(),
                networks=self._network,
                metadata={
                    **request.metadata,
                    OWNER_KEY: request.region,
                    POOL_KEY: request.pool_id,
                    CAPACITY_KEY: "committed" if request.reservation_id else "reclaimable",
                },
                **kwargs,
            )
            # Look-up-then-create is not atomic: a concurrent create of the same name may
            # have landed too. Both creators keep the same (oldest) one.
            kept = self._dedupe(request.name, request.region)
            return made if kept is None else kept

        server = await self._run(go)
        return self._view(server).model_copy(
            update={"pool_id": request.pool_id, "hall": request.hall}
        )

    async def delete(self, provider_id: str) -> None:
        await self._run(lambda: self._conn.compute.delete_server(provider_id, ignore_missing=True))

    async def get(self, provider_id: str) -> ProviderInstance:
        server = await self._run(lambda: self._conn.compute.get_server(provider_id))
        return self._view(server)

    async def list_owned(self, region: str) -> list[ProviderInstance]:
        servers = await self._run(lambda: list(self._conn.compute.servers(details=True)))
        return [self._view(s) for s in servers if (s.metadata or {}).get(OWNER_KEY) == region]

    async def free_capacity(self, pool_id: str) -> int:
        """Instances of the pool's flavor that fit the hall's free Placement inventory,
        leaving out Blazar's reservable hosts (the `freepool` aggregate: committed)."""
        pid = PoolId.parse(pool_id)
        hall = pid.hall

        def go() -> int:
            flavor = self._conn.compute.find_flavor(pid.flavor, ignore_missing=False)
            hosts: set[str] = set()
            committed: set[str] = set()
            for agg in self._conn.compute.aggregates():
                if agg.availability_zone == hall:
                    hosts |= set(agg.hosts or [])
                if agg.name == "freepool":
                    committed |= set(agg.hosts or [])
            place = self._conn.placement
            total = 0
            for rp in place.get("/resource_providers").json()["resource_providers"]:
                if rp["name"] not in hosts - committed:
                    continue
                inventory = place.get(f"/resource_providers/{rp['uuid']}/inventories").json()
                usages = place.get(f"/resource_providers/{rp['uuid']}/usages").json()
                free_vcpu = _free(inventory["inventories"], usages["usages"], "VCPU")
                free_ram = _free(inventory["inventories"], usages["usages"], "MEMORY_MB")
                total += max(
                    0, int(min(free_vcpu // max(flavor.vcpus, 1), free_ram // max(flavor.ram, 1)))
                )
            return total

        return await self._run(go)

    # -- Blazar ----------------------------------------------------------------------------

    def _blazar(self, method: str, url: str, **kwargs: Any) -> Any:
        resp = getattr(self._conn.reservation, method)(url, **kwargs)
        if resp.status_code >= 400:
            raise os_exc.HttpException(
                message=f"{method.upper()} {url}: {resp.text[:300]}", response=resp
            )
        return resp.json() if resp.content else None

    def _reservation_flavor(self, reservation_id: str) -> str:
        for lease in self._blazar("get", "/leases")["leases"]:
            for res in lease.get("reservations", []):
                if res["id"] == reservation_id:
                    if lease["status"] != "ACTIVE":
                        raise Permanent(f"reservation {reservation_id} is {lease['status']}")
                    return str(res["flavor_id"])
        raise NotFound(f"reservation {reservation_id} not found")

    @staticmethod
    def _as_reservation(lease: dict[str, Any]) -> Reservation:
        """Hall, flavor name and owner come from the lease's name: Blazar keeps its own
        flavor (by id) and the hall only as a host property."""
        res = (lease.get("reservations") or [{}])[0]
        parsed = parse_lease_name(lease["name"])
        created = lease.get("created_at")
        return Reservation(
            reservation_id=res.get("id", ""),
            lease_id=lease["id"],
            name=lease["name"],
            hall=parsed.hall if parsed else "",
            flavor=parsed.flavor if parsed else "",
            owner=parsed.owner if parsed else "",
            amount=int(res.get("amount") or 0),
            status=lease["status"],
            end=_blazar_time(lease["end_date"]),
            created_at=_blazar_time(created) if created else None,
        )

    async def create_reservation(self, request: ReservationRequest) -> Reservation:
        check_lease_name(request)

        def go() -> Reservation:
            for lease in self._blazar("get", "/leases")["leases"]:
                if lease["name"] == request.name:
                    return self._as_reservation(lease)
            flavor = self._conn.compute.find_flavor(request.flavor, ignore_missing=False)
            props = (
                f'["=", "${self._hall_property}", "{request.hall}"]' if self._hall_property else ""
            )
            body = {
                "name": request.name,
                "start_date": request.start.strftime(_BLAZAR_TIME) if request.start else "now",
                "end_date": request.end.astimezone(UTC).strftime(_BLAZAR_TIME),
                "reservations": [
                    {
                        "resource_type": "virtual:instance",
                        "amount": request.amount,
                        "vcpus": flavor.vcpus,
                        "memory_mb": flavor.ram,
                        "disk_gb": flavor.disk,
                        "affinity": None,
                        "resource_properties": props,
                    }
                ],
                "events": [],
            }
            lease = self._blazar("post", "/leases", json=body)["lease"]
            return self._as_reservation(lease)

        return await self._run(go)

    async def extend_reservation(self, lease_id: str, end: datetime) -> Reservation:
        body = {"end_date": end.astimezone(UTC).strftime(_BLAZAR_TIME)}
        lease = await self._run(lambda: self._blazar("put", f"/leases/{lease_id}", json=body))
        return self._as_reservation(lease["lease"])

    async def delete_reservation(self, lease_id: str) -> None:
        try:
            await self._run(lambda: self._blazar("delete", f"/leases/{lease_id}"))
        except NotFound:
            return

    async def pending_reclaims(self, region: str, hall: str) -> list[ReclaimDecision]:
        """Reclaimable instances on hosts that a Blazar host lease claims: one that started
        (reclaim now), or one still PENDING (reclaim at its start: known in advance, so the
        relay sends an early warning now)."""

        def go() -> list[ReclaimDecision]:
            leases = self._blazar("get", "/leases")["leases"]
            live = {lease["id"] for lease in leases if lease["status"] in ("STARTING", "ACTIVE")}
            upcoming = {
                lease["id"]: _blazar_time(lease["start_date"])
                for lease in leases
                if lease["status"] == "PENDING" and lease.get("start_date")
            }
            # /os-hosts/allocations also lists instance reservations (SCO's own committed
            # capacity): those reserve slots on a host, they do not claim it.
            host_reservations = {
                r["id"]
                for lease in leases
                for r in lease.get("reservations", [])
                if r.get("resource_type") == "physical:host"
            }
            names = {
                str(h["id"]): h["hypervisor_hostname"]
                for h in self._blazar("get", "/os-hosts")["hosts"]
            }
            # host -> None (claimed now) or the earliest start of a lease that will claim it
            claimed: dict[str, datetime | None] = {}
            for alloc in self._blazar("get", "/os-hosts/allocations")["allocations"]:
                host = names.get(str(alloc["resource_id"]), "")
                for r in alloc.get("reservations", []):
                    if r.get("id") not in host_reservations:
                        continue
                    lease_id = r.get("lease_id")
                    if lease_id in live:
                        claimed[host] = None
                    elif lease_id in upcoming and (host not in claimed or claimed[host]):
                        start = upcoming[lease_id]
                        claimed[host] = min(start, claimed.get(host) or start)
            out = []
            for server in self._conn.compute.servers(details=True):
                meta = server.metadata or {}
                if (
                    meta.get(OWNER_KEY) == region
                    and meta.get(CAPACITY_KEY) == "reclaimable"
                    and server.availability_zone == hall
                    and server.compute_host in claimed
                    and server.id not in self._decided
                ):
                    self._decided.add(server.id)
                    at = claimed[server.compute_host]
                    out.append(
                        ReclaimDecision(
                            provider_id=server.id,
                            reason=f"Blazar lease claims host {server.compute_host}"
                            + (f" from {at.isoformat()}" if at is not None else ""),
                            at=at,
                        )
                    )
            return out

        return await self._run(go)

    async def list_reservations(self, region: str) -> list[Reservation]:
        leases = await self._run(lambda: self._blazar("get", "/leases")["leases"])
        return [
            self._as_reservation(lease)
            for lease in leases
            if lease["name"].startswith(lease_prefix(region))
            and parse_lease_name(lease["name"], region) is not None
        ]
