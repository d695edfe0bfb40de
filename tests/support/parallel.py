"""Which tests share a pytest-xdist worker (`make test` runs the suite in several at once).

Most tests are independent by construction (a scratch database, a namespace and task queue
of their own, free ports, a NATS server per worker: tests/support/worker_nats.py) and are
spread one by one. Two kinds are not, and get an `xdist_group` (`--dist loadgroup`):

- a module with a module- or class-scoped fixture (a Slurm cluster, a Patroni cluster, a
  podman image): all its tests on one worker, so the fixture is built once, not once per
  worker that drew one of its tests;
- tests on one machine-wide thing that is not ours to split: the OpenStack test cloud (its
  hosts' capacity and its instances are shared: two acquisitions at once would see each
  other's servers) and podman (one image store, the node containers' fixed names).

A session fixture is built once per worker that draws one of its tests. Ceph RGW (a mon,
an OSD and a gateway: ~15 s of both cores) is the costly one: its tests join podman's
worker, where the region-as-shipped test brings it up anyway, so CI starts it once, not
three times. They run there while the image builds (collection order puts them first).
"""

from __future__ import annotations

import types

import pytest

#: Modules whose tests drive podman (image build, containers, `podman kube play`).
PODMAN_MODULES = (
    "tests/deploy/test_agent_deb_container.py",
    "tests/deploy/test_image.py",
    "tests/deploy/test_kube_play.py",
    "tests/deploy/test_region_as_shipped.py",
)

#: The session fixture whose tests run on podman's worker (see the module's docstring).
SHARES_PODMANS_WORKER = "rgw"


def group_of(item: pytest.Item) -> str | None:
    path = item.nodeid.split("::", 1)[0]
    if item.get_closest_marker("testcloud") is not None:
        return "testcloud"
    if path in PODMAN_MODULES:
        return "podman"
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    if fixtureinfo is not None and SHARES_PODMANS_WORKER in fixtureinfo.names_closure:
        return "podman"
    defs = fixtureinfo.name2fixturedefs.values() if fixtureinfo is not None else ()
    if any(d[-1].scope in ("module", "class", "package") for d in defs if d):
        return path
    return None


def group(items: list[pytest.Item]) -> None:
    for item in items:
        if name := group_of(item):
            item.add_marker(pytest.mark.xdist_group(name))


#: Fixtures that bring up or connect to a real service: a test that uses one (directly or
#: through another fixture) is not in the fast tier.
SERVICE_FIXTURES = frozenset(
    {
        "pg_dsn",
        "fleet_repo",
        "tansu",
        "kafka_bootstrap",
        "dev_server_env",
        "region_client",
        "rgw",
        "process_db",
        "nats_region",
        "box_env",
        "openbao_server",
    }
)
#: Module-level names through which a test module reaches a service without a fixture.
SERVICE_GLOBALS = ("NATS_URL", "NATS", "BASE_DSN")
#: Support modules that start or reach a service (a harness on PostgreSQL, a Slurm or
#: Patroni cluster, the box's processes): a test module using one needs services.
SERVICE_MODULES = frozenset(
    {
        "tests.support.agent_slurm_cluster",
        "tests.support.control_harness",
        "tests.support.deb_node",
        "tests.support.image",
        "tests.support.kube_play",
        "tests.support.patroni_cluster",
        "tests.support.sco_process",
        "tests.support.slurm_burst_cluster",
        "tests.support.slurm_cluster",
        "tests.support.spark_cluster",
        "tests.support.worker_kills",
        "tests.support.worker_nats",
    }
)
#: Markers of tests that need more than the venv (the test cloud, the box, tools, clusters).
SERVICE_MARKERS = ("services", "testcloud", "devbox", "chaos", "chaos_slow", "slow", "tools")


def needs_services(item: pytest.Item) -> bool:
    """Whether the test needs a running service (PostgreSQL, NATS, Temporal's dev server,
    Kafka, RGW, the test cloud, podman, a cluster). The fast tier (`make check`) runs the
    rest, in a network namespace of its own where no service answers, so a test missed
    here fails there instead of passing by luck."""
    if any(item.get_closest_marker(m) is not None for m in SERVICE_MARKERS):
        return True
    if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    module = getattr(item, "module", None)
    if module is None:
        return False
    if any(hasattr(module, g) for g in SERVICE_GLOBALS):
        return True
    return any(_home(value) in SERVICE_MODULES for value in vars(module).values())


def _home(value: object) -> str | None:
    """The module a global of a test module comes from (itself, when it is a module)."""
    if isinstance(value, types.ModuleType):
        return value.__name__
    home = getattr(value, "__module__", None)
    return home if isinstance(home, str) else None


def mark_services(items: list[pytest.Item]) -> None:
    for item in items:
        if needs_services(item):
            item.add_marker(pytest.mark.services)
