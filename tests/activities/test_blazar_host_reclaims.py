"""`OpenStackProvider.pending_reclaims` against a real Blazar host lease, on the real
OpenStack test cloud (``deploy/testcloud/up.sh``: Nova with fake computes, Blazar 18).

What it proves: a reclaimable SCO server runs on a Blazar reservable host; a
``physical:host`` lease that claims that host and starts later (PENDING) makes
``pending_reclaims`` return exactly that server, with ``at`` = the lease's start, once (a
second call returns nothing). A PENDING *instance* lease on the same host that starts
earlier changes nothing: instance reservations are SCO's own committed capacity, they take
slots on a host and do not claim it (Blazar's ``/os-hosts/allocations`` lists both).

Why this host and not a hall's spot host: Blazar refuses to enrol a host that has servers
(``HostHavingServers``, blazar/plugins/oshosts/host_plugin.py), and enrolling ``hall-h``
would move it into ``freepool``, where BlazarFilter keeps every unreserved server off it:
the other test runs on this cloud, which boot spot servers there, would get NoValidHost.
So the server is booted onto the hall's already-enrolled ``hall-h-committed`` (in production:
reclaimable work on a reservable host that no lease holds yet) with Nova's ``AZ:host``
forced placement, which skips the scheduler filters; nothing is enrolled or unenrolled.

The lease is not let start: on these hosts a host lease fails at its start (Blazar gives
each host reservation its own AZ, Nova refuses a host in two AZs, see the testcloud README),
and on the way it would take the host out of ``freepool`` under the other test runs. The
leases are far in the future (+20 / +30 days) so they overlap nobody's reservations.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities.provider.errors import NotFound
from activities.provider.interface import CreateRequest, InstanceStatus, ProviderInstance
from activities.provider.openstack import OpenStackProvider
from tests.support.testcloud import provider_or_skip
from tests.support.wait import eventually_async

pytestmark = [
    pytest.mark.testcloud,
    # openstacksdk's notices about its own future API changes, raised from inside the SDK
    pytest.mark.filterwarnings("ignore::openstack.warnings.RemovedInSDK50Warning"),
    pytest.mark.filterwarnings("ignore::openstack.warnings.RemovedInSDK60Warning"),
]

HALL = "C"
HOST = "hall-c-committed"  # the hall's Blazar reservable host (seed.py)
POOL = "r1.C.gp.l"  # the smallest VM: 64 fit on a host
BLAZAR_TIME = "%Y-%m-%d %H:%M"  # Blazar's dates have minutes, no seconds


def blazar(p: OpenStackProvider, method: str, url: str, **kw: Any) -> Any:
    resp = getattr(p.connection.reservation, method)(url, **kw)
    assert resp.status_code < 400, f"{method.upper()} {url}: {resp.status_code} {resp.text[:500]}"
    return resp.json() if resp.content else None


async def blazar_async(p: OpenStackProvider, method: str, url: str, **kw: Any) -> Any:
    return await asyncio.to_thread(blazar, p, method, url, **kw)


async def launch(p: OpenStackProvider, req: CreateRequest) -> ProviderInstance:
    inst = await p.create(req)
    if inst.status is InstanceStatus.BUILD:
        inst = await eventually_async(
            lambda: _built(p, inst.provider_id),
            timeout=300,
            what=f"{inst.provider_id} out of BUILD",
            retrying=(),
        )
    assert inst.status is InstanceStatus.ACTIVE, inst
    return inst


async def _built(p: OpenStackProvider, provider_id: str) -> ProviderInstance | None:
    inst = await p.get(provider_id)
    return None if inst.status is InstanceStatus.BUILD else inst


async def _gone(p: OpenStackProvider, provider_id: str) -> bool:
    try:
        await p.get(provider_id)
    except NotFound:
        return True
    return False


async def make_lease(
    p: OpenStackProvider, name: str, start: datetime, reservation: dict[str, Any]
) -> dict[str, Any]:
    body = {
        "name": name,
        "start_date": start.strftime(BLAZAR_TIME),
        "end_date": (start + timedelta(hours=1)).strftime(BLAZAR_TIME),
        "reservations": [reservation],
        "events": [],
    }
    lease: dict[str, Any] = (await blazar_async(p, "post", "/leases", json=body))["lease"]
    return lease


@pytest.mark.timeout(150)
async def test_a_pending_host_lease_reclaims_the_hosts_reclaimables_at_its_start() -> None:
    p = provider_or_skip()
    tag = uuid.uuid4().hex[:8]
    # A region of this test alone: other runs' r1 servers on the cloud are not ours to
    # count, and their leak checks (sco-region = r1, leases sco-r1-*) never see ours.
    region = f"tbr{tag}"
    server: ProviderInstance | None = None
    lease_ids: list[str] = []
    try:
        server = await launch(
            p,
            CreateRequest(
                name=f"sco-{region}-reclaimable-0",
                region=region,
                pool_id=POOL,
                # AZ:host forces the host, past BlazarFilter (admin only): see the docstring
                hall=f"{HALL}:{HOST}",
                flavor="gp.l",
            ),
        )
        assert server.host == HOST
        assert server.metadata["sco-capacity"] == "reclaimable"
        hosts = {
            h["hypervisor_hostname"]: h
            for h in (await blazar_async(p, "get", "/os-hosts"))["hosts"]
        }
        assert HOST in hosts, f"{HOST} is not enrolled in Blazar (seed.py enrols it)"

        now = datetime.now(UTC).replace(second=0, microsecond=0)
        host_start = now + timedelta(days=30)
        host_lease = await make_lease(
            p,
            f"sco-test-hostlease-{tag}",
            host_start,
            {
                "resource_type": "physical:host",
                "min": 1,
                "max": 1,
                # pinned to the server's host by name; the hall capability is seed.py's
                "hypervisor_properties": json.dumps(["=", "$hypervisor_hostname", HOST]),
                "resource_properties": json.dumps(["=", "$hall", HALL]),
            },
        )
        lease_ids.append(host_lease["id"])
        # Earlier than the host lease: before the fix this lease's allocation made
        # pending_reclaims report the instance lease's start (or "now" once ACTIVE).
        instance_lease = await make_lease(
            p,
            f"sco-test-instlease-{tag}",
            now + timedelta(days=20),
            {
                "resource_type": "virtual:instance",
                "amount": 1,
                "vcpus": 1,
                "memory_mb": 1024,
                "disk_gb": 10,
                "affinity": None,
                "resource_properties": json.dumps(["=", "$hall", HALL]),
            },
        )
        lease_ids.append(instance_lease["id"])
        for lease in (host_lease, instance_lease):
            got = (await blazar_async(p, "get", f"/leases/{lease['id']}"))["lease"]
            assert got["status"] == "PENDING", got
        # Both really sit on the server's host (else the assertions below prove nothing).
        allocs = (await blazar_async(p, "get", f"/os-hosts/{hosts[HOST]['id']}/allocation"))[
            "allocation"
        ]["reservations"]
        assert {a["lease_id"] for a in allocs} >= set(lease_ids), allocs

        decisions = await p.pending_reclaims(region, HALL)
        assert [(d.provider_id, d.at) for d in decisions] == [(server.provider_id, host_start)]
        assert HOST in decisions[0].reason
        # The provider remembers what it decided: the relay is told once.
        assert await p.pending_reclaims(region, HALL) == []
    finally:
        # Cleanup runs on a failed assertion too; the first error of it is re-raised at
        # the end, after everything else has been tried.
        errors: list[BaseException] = []
        for lease_id in lease_ids:
            try:
                await p.delete_reservation(lease_id)
            except BaseException as exc:
                errors.append(exc)
        if server is not None:
            try:
                await p.delete(server.provider_id)
                await eventually_async(
                    functools.partial(_gone, p, server.provider_id),
                    timeout=300,
                    what=f"{server.provider_id} deleted",
                    retrying=(),
                )
            except BaseException as exc:
                errors.append(exc)
        await p.close()
        if errors:
            raise errors[0]
