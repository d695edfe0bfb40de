"""Test-cloud plumbing that up.sh runs with the test cloud's own venv (no repo imports).

    bootstrap.py catalog                  register services and endpoints in Keystone
    bootstrap.py wait-computes HOST...    wait until every HOST is an up hypervisor in Nova
                                          and a resource provider in Placement

Both are idempotent. The cloud comes from OS_CLIENT_CONFIG_FILE / OS_CLOUD.
"""

from __future__ import annotations

import os
import sys
import time

import openstack

REGION = "RegionOne"
# service name, type, URL
CATALOG = [
    ("nova", "compute", "http://127.0.0.1:8774/v2.1"),
    ("placement", "placement", "http://127.0.0.1:8778"),
    ("glance", "image", "http://127.0.0.1:9292"),
    ("neutron", "network", "http://127.0.0.1:9696"),
    ("blazar", "reservation", "http://127.0.0.1:1234/v1"),
    ("ironic", "baremetal", "http://127.0.0.1:6385"),
]


def connect() -> openstack.connection.Connection:
    return openstack.connect(cloud=os.environ.get("OS_CLOUD", "sco-testcloud"))


def catalog() -> None:
    c = connect()
    made = 0
    services = {s.type: s for s in c.identity.services()}
    endpoints = {(e.service_id, e.interface) for e in c.identity.endpoints()}
    for name, typ, url in CATALOG:
        svc = services.get(typ) or c.identity.create_service(name=name, type=typ, is_enabled=True)
        for iface in ("public", "internal", "admin"):
            if (svc.id, iface) not in endpoints:
                c.identity.create_endpoint(
                    service_id=svc.id, interface=iface, url=url, region_id=REGION
                )
                made += 1
    role = c.identity.find_role("service") or c.identity.create_role(name="service")
    project = c.identity.find_project("admin")
    user = c.identity.find_user("admin")
    if not c.identity.validate_user_has_project_role(project, user, role):
        c.identity.assign_project_role_to_user(project, user, role)
    print(f"catalog: {len(CATALOG)} services, {made} endpoints created")


def wait_computes(hosts: list[str], timeout: float = 240) -> None:
    c = connect()
    want = set(hosts)
    t0 = time.monotonic()
    while True:
        # nova-scheduler maps new hosts into cell1 every 5 s (discover_hosts_in_cells_interval)
        up = {h.name for h in c.compute.hypervisors() if h.state == "up" and h.status == "enabled"}
        rps = {rp.name for rp in c.placement.resource_providers()}
        missing = sorted(want - (up & rps))
        if not missing:
            print(f"computes: {len(want)} hosts up in Nova and Placement")
            return
        if time.monotonic() - t0 > timeout:
            sys.exit(f"computes not up after {timeout:.0f}s: {', '.join(missing)}")
        time.sleep(1)


def main(argv: list[str]) -> None:
    if argv[:1] == ["catalog"]:
        catalog()
    elif argv[:1] == ["wait-computes"] and len(argv) > 1:
        wait_computes(argv[1:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
