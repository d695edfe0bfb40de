"""The one naming scheme of every Blazar lease SCO makes.

`sco-<region>-<hall>-<flavor>-<owner>`: the region says whose it is (a provider lists only
its region's leases), hall and flavor are what the lease holds (Blazar keeps neither by
name: a lease has no metadata, its hall is a host property and its flavor a private one
Blazar made), and the owner is the SCO name of what uses it (a floor's
`floor-<region>-<contract>-<hall>-<gen>`, a fallback's `fallback-<acquisition id>`).
Halls are one letter and a flavor is `<sku>.<size>` with no `-` in its size, so the name
parses back without ambiguity. Pure: the workflows name leases with it too.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic import BaseModel

from activities.provider.errors import Permanent

if TYPE_CHECKING:
    from activities.provider.interface import ReservationRequest

#: Prefix of the owner part of a fallback lease (the acquisition that made it follows).
FALLBACK_OWNER = "fallback-"
#: Blazar keeps lease names in a String(80) column; longer names are refused (HTTP 400).
MAX_LEASE_NAME = 80

_NAME = re.compile(
    r"^sco-(?P<region>[^-]+)-(?P<hall>[^-]+)-(?P<flavor>[^.]+\.[^-]+)-(?P<owner>.+)$"
)


class LeaseName(BaseModel):
    region: str
    hall: str
    flavor: str
    owner: str


def lease_prefix(region: str) -> str:
    return f"sco-{region}-"


def lease_name(region: str, hall: str, flavor: str, owner: str) -> str:
    return f"{lease_prefix(region)}{hall}-{flavor}-{owner}"


def parse_lease_name(name: str, region: str | None = None) -> LeaseName | None:
    """The parts of an SCO lease name; None for anyone else's lease (or another region's)."""
    m = _NAME.match(name)
    if m is None or (region is not None and m["region"] != region):
        return None
    return LeaseName(region=m["region"], hall=m["hall"], flavor=m["flavor"], owner=m["owner"])


def fallback_owner(acquisition_id: str) -> str:
    return f"{FALLBACK_OWNER}{acquisition_id}"


def fallback_acquisition(owner: str) -> str | None:
    """The acquisition a fallback lease belongs to; None for a floor's lease."""
    return owner[len(FALLBACK_OWNER) :] if owner.startswith(FALLBACK_OWNER) else None


def check_lease_name(request: ReservationRequest) -> None:
    """A provider makes only leases it can list back: named by the scheme, for the
    request's own region, hall and flavor, and short enough for Blazar."""
    parsed = parse_lease_name(request.name, request.region)
    if parsed is None or (parsed.hall, parsed.flavor) != (request.hall, request.flavor):
        raise Permanent(
            f"lease name {request.name!r} is not "
            f"{lease_name(request.region, request.hall, request.flavor, '<owner>')!r}"
        )
    if len(request.name) > MAX_LEASE_NAME:
        raise Permanent(
            f"lease name {request.name!r}: {len(request.name)} characters, Blazar keeps "
            f"at most {MAX_LEASE_NAME}"
        )
