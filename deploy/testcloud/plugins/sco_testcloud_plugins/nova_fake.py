"""Nova's fake virt driver with a configurable size per compute host.

Nova's ``fake.FakeDriverWithoutFakeNodes`` reports a fixed 1000 vCPU, 800000 MB and
600000 GB per host: one instance of each of the region's three largest shapes, and a fixed
size that a test cannot choose. Blazar sizes instance reservations from the same hypervisor
numbers, so allocation ratios would not help it. ``SizedFakeDriver`` takes its size from
``[sco_fake]`` in the compute's config file.

Nova loads virt drivers from the ``nova.virt`` package only (``compute_driver = fake.X``
means ``nova.virt.fake.X``), so the console script ``sco-testcloud-nova-compute`` (this
module's ``main``) adds the class to ``nova.virt.fake`` and then runs ``nova-compute``;
its config says ``compute_driver = fake.SizedFakeDriver``.
"""

from __future__ import annotations

from typing import Any

from oslo_config import cfg

OPTS = [
    cfg.IntOpt("vcpus", default=1024, min=1, help="vCPUs the fake host reports"),
    cfg.IntOpt("memory_mb", default=1024 * 1024, min=1, help="RAM (MB) it reports"),
    cfg.IntOpt("local_gb", default=100_000, min=1, help="local disk (GB) it reports"),
]


def main() -> Any:
    # nova-compute's own entry point first, exactly as its console script imports it
    from nova.cmd import compute
    from nova.virt import fake

    cfg.CONF.register_opts(OPTS, group="sco_fake")

    class SizedFakeDriver(fake.FakeDriverWithoutFakeNodes):
        """A single-node fake host (node name = ``[DEFAULT] host``) of a configurable size."""

        def __init__(self, virtapi: Any, read_only: bool = False) -> None:
            conf = cfg.CONF.sco_fake
            # FakeDriver.__init__ builds its resource tracker from these attributes.
            self.vcpus = conf.vcpus
            self.memory_mb = conf.memory_mb
            self.local_gb = conf.local_gb
            super().__init__(virtapi, read_only)

    fake.SizedFakeDriver = SizedFakeDriver
    return compute.main()
