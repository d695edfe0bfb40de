"""An ML2 mechanism driver that binds every port on any host, without an agent.

The test cloud runs Neutron's API server only (no OVS/OVN, no agents). With no mechanism
driver a port cannot be bound, so Nova fails a boot on a network with PortBindingFailed.
This driver binds the first segment of every port with VIF type ``other``; Nova's fake virt
driver plugs nothing, so servers boot on a real Neutron network, get a port and a fixed IP
(IPAM in Neutron's database), and no packet is ever sent anywhere.
"""

from __future__ import annotations

from typing import Any

from neutron_lib import constants
from neutron_lib.api.definitions import portbindings
from neutron_lib.plugins.ml2 import api


class FakeBindMechanismDriver(api.MechanismDriver):
    def initialize(self) -> None:
        pass

    def bind_port(self, context: Any) -> None:
        for segment in context.segments_to_bind:
            context.set_binding(
                segment[api.ID],
                portbindings.VIF_TYPE_OTHER,
                {portbindings.CAP_PORT_FILTER: False},
                status=constants.PORT_STATUS_ACTIVE,
            )
            return
