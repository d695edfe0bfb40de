"""The simulated cloud as a small local service, over NATS request-reply.

One process (`sco sim serve --region r1`, `services/simulator/service.py`) owns the
SimulatedCloud; workers, notice relays and tools reach it through `SimulatorClient`, which
implements CloudProvider. NATS runs in every region anyway, so the simulator needs no port
or HTTP stack of its own.

Subjects: `sco.<region>.sim.<operation>`; a request is the JSON of the call's arguments,
a reply `{"ok": <result>}` or `{"error": <ProviderError class>, "message", "retry_after"}`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from pydantic import TypeAdapter

from activities.provider import errors
from activities.provider.interface import (
    CreateRequest,
    ProviderInstance,
    ReclaimDecision,
    Reservation,
    ReservationRequest,
)

if TYPE_CHECKING:  # the server side only: a client (relay, worker, CLI) never loads the cloud
    from activities.provider.simulator import SimulatedCloud

log = logging.getLogger(__name__)

_ERRORS: dict[str, type[errors.ProviderError]] = {
    cls.__name__: cls
    for cls in (
        errors.InsufficientCapacity,
        errors.NotFound,
        errors.RateLimited,
        errors.Transient,
        errors.Permanent,
    )
}
_INSTANCES = TypeAdapter(list[ProviderInstance])
_RESERVATIONS = TypeAdapter(list[Reservation])


def subject(region: str, operation: str, prefix: str = "sco") -> str:
    return f"{prefix}.{region}.sim.{operation}"


async def _dispatch(cloud: SimulatedCloud, op: str, args: dict[str, Any]) -> Any:
    if op == "create":
        return (await cloud.create(CreateRequest.model_validate(args))).model_dump(mode="json")
    if op == "delete":
        return await cloud.delete(args["provider_id"])
    if op == "get":
        return (await cloud.get(args["provider_id"])).model_dump(mode="json")
    if op == "list_owned":
        return _INSTANCES.dump_python(await cloud.list_owned(args["region"]), mode="json")
    if op == "free_capacity":
        return await cloud.free_capacity(args["pool_id"])
    if op == "create_reservation":
        res = await cloud.create_reservation(ReservationRequest.model_validate(args))
        return res.model_dump(mode="json")
    if op == "extend_reservation":
        res = await cloud.extend_reservation(args["lease_id"], datetime.fromisoformat(args["end"]))
        return res.model_dump(mode="json")
    if op == "delete_reservation":
        return await cloud.delete_reservation(args["lease_id"])
    if op == "list_reservations":
        return _RESERVATIONS.dump_python(await cloud.list_reservations(args["region"]), mode="json")
    if op == "pending_reclaims":
        found = await cloud.pending_reclaims(args["region"], args["hall"])
        return [d.model_dump(mode="json") for d in found]
    if op == "reclaim":
        cloud.reclaim(list(args["provider_ids"]))
        return None
    if op == "fail_hall":
        cloud.fail_hall(args["hall"])
        return None
    if op == "restore_hall":
        cloud.restore_hall(args["hall"])
        return None
    raise errors.Permanent(f"unknown simulator operation {op!r}")


async def serve(cloud: SimulatedCloud, nc: NATS, *, prefix: str = "sco") -> None:
    """Answer requests for the cloud's region until cancelled."""

    async def handle(msg: Msg) -> None:
        op = msg.subject.rsplit(".", 1)[-1]
        try:
            result = await _dispatch(cloud, op, json.loads(msg.data or b"{}"))
            reply: dict[str, Any] = {"ok": result}
        except errors.ProviderError as exc:
            retry = getattr(exc, "retry_after", None)
            reply = {
                "error": type(exc).__name__,
                "message": str(exc),
                "retry_after": retry.total_seconds() if retry else None,
            }
        except Exception as exc:  # a malformed request must not kill the simulator
            reply = {"error": "Permanent", "message": f"bad request: {exc}"}
        await msg.respond(json.dumps(reply).encode())

    where = subject(cloud.region.id, "*", prefix)
    await nc.subscribe(where, queue="sco-sim", cb=handle)
    log.info("simulated cloud for %s serving on %s", cloud.region.id, where)
    await asyncio.Event().wait()


class SimulatorClient:
    """CloudProvider over the simulator service."""

    def __init__(
        self,
        nats_url: str,
        region: str,
        *,
        timeout: float = 10.0,
        prefix: str = "sco",
        connect_options: dict[str, Any] | None = None,
    ) -> None:
        """`connect_options`: extra `nats.connect` arguments (TLS)."""
        self._url = nats_url
        self._connect_options = dict(connect_options or {})
        self._region = region
        self._prefix = prefix
        self._timeout = timeout
        self._nc: NATS | None = None

    async def _call(self, op: str, args: dict[str, Any]) -> Any:
        if self._nc is None or not self._nc.is_connected:
            self._nc = await nats.connect(self._url, connect_timeout=5, **self._connect_options)
        try:
            msg = await self._nc.request(
                subject(self._region, op, self._prefix),
                json.dumps(args).encode(),
                timeout=self._timeout,
            )
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise errors.Transient(f"simulator for {self._region} does not answer: {exc}") from exc
        reply = json.loads(msg.data)
        if "error" in reply:
            cls = _ERRORS.get(reply["error"], errors.Permanent)
            if cls is errors.RateLimited:
                raise errors.RateLimited(reply["message"], reply.get("retry_after"))
            raise cls(reply["message"])
        return reply["ok"]

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()

    async def create(self, request: CreateRequest) -> ProviderInstance:
        return ProviderInstance.model_validate(
            await self._call("create", request.model_dump(mode="json"))
        )

    async def delete(self, provider_id: str) -> None:
        await self._call("delete", {"provider_id": provider_id})

    async def get(self, provider_id: str) -> ProviderInstance:
        return ProviderInstance.model_validate(
            await self._call("get", {"provider_id": provider_id})
        )

    async def list_owned(self, region: str) -> list[ProviderInstance]:
        return _INSTANCES.validate_python(await self._call("list_owned", {"region": region}))

    async def free_capacity(self, pool_id: str) -> int:
        return int(await self._call("free_capacity", {"pool_id": pool_id}))

    async def create_reservation(self, request: ReservationRequest) -> Reservation:
        return Reservation.model_validate(
            await self._call("create_reservation", request.model_dump(mode="json"))
        )

    async def extend_reservation(self, lease_id: str, end: datetime) -> Reservation:
        return Reservation.model_validate(
            await self._call("extend_reservation", {"lease_id": lease_id, "end": end.isoformat()})
        )

    async def delete_reservation(self, lease_id: str) -> None:
        await self._call("delete_reservation", {"lease_id": lease_id})

    async def list_reservations(self, region: str) -> list[Reservation]:
        return _RESERVATIONS.validate_python(
            await self._call("list_reservations", {"region": region})
        )

    async def pending_reclaims(self, region: str, hall: str) -> list[ReclaimDecision]:
        found = await self._call("pending_reclaims", {"region": region, "hall": hall})
        return [ReclaimDecision.model_validate(d) for d in found]

    async def fail_hall(self, hall: str) -> None:
        await self._call("fail_hall", {"hall": hall})

    async def restore_hall(self, hall: str) -> None:
        await self._call("restore_hall", {"hall": hall})
