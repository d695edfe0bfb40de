"""The pool id: ``<region>.<hall>.<sku>.<size>``, e.g. ``r1.A.gp.xl``.

Pool ids cross every boundary as that plain string (workflow inputs, fleet rows, notice
subjects, metrics labels), so the wire format is the string; :class:`PoolId` is the one
place that builds and reads it. Each part is a region-file name (letters, digits, ``-``,
``_``, starting with a letter or digit), which is what keeps the dotted form unambiguous.
The size is not checked against the region's sizes here: that is the region file's job
(:meth:`contracts.region.Region.pool`).

This module is part of the contract layer: it must not import ``workflows``,
``activities`` or ``workers``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["NAME_RE", "SIZES", "PoolId", "Size"]

#: An instance size of a region's SKUs. Here, not in contracts.region, so the contract
#: models (and the node agent, which reads them) need not load the region file's models.
Size = Literal["l", "xl", "2xl", "4xl"]
SIZES: tuple[Size, ...] = ("l", "xl", "2xl", "4xl")

#: One part of a pool id (and any name of a region file): no dots, no spaces.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")

_PARTS = ("region", "hall", "sku", "size")
# Longer than any real id by far; a bound so a hostile argument is not echoed in full.
_MAX_LEN = 200
_SHOWN = 60


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


@dataclass(frozen=True, slots=True)
class PoolId:
    """One pool's identity; ``str()`` gives the wire form, :meth:`parse` reads it."""

    region: str
    hall: str
    sku: str
    size: str

    def __post_init__(self) -> None:
        for part in _PARTS:
            value = getattr(self, part)
            if not isinstance(value, str) or not NAME_RE.fullmatch(value):
                raise ValueError(
                    f"pool id {part} {_shown(str(value))} is not a name "
                    "(letters, digits, '-' or '_', starting with a letter or digit)"
                )

    @classmethod
    def parse(cls, text: str) -> PoolId:
        """The pool id of ``r1.A.gp.xl``; ValueError saying what is wrong when it is not one."""
        if not isinstance(text, str):
            raise ValueError(f"a pool id is a string, not {type(text).__name__}")
        if len(text) > _MAX_LEN:
            raise ValueError(
                f"not a pool id (region.hall.sku.size): {len(text)} characters, "
                f"more than {_MAX_LEN}: {_shown(text)}"
            )
        parts = text.split(".")
        if len(parts) != len(_PARTS):
            raise ValueError(
                f"not a pool id (region.hall.sku.size): {_shown(text)} has "
                f"{len(parts)} dot-separated part(s), not {len(_PARTS)}"
            )
        for part, value in zip(_PARTS, parts, strict=True):
            if not NAME_RE.fullmatch(value):
                what = "is empty" if not value else f"{_shown(value)} is not a name"
                raise ValueError(
                    f"not a pool id (region.hall.sku.size): {_shown(text)}: the {part} "
                    f"{what} (letters, digits, '-' or '_', starting with a letter or digit)"
                )
        region, hall, sku, size = parts
        return cls(region=region, hall=hall, sku=sku, size=size)

    @property
    def flavor(self) -> str:
        """The OpenStack flavor name of the pool, ``<sku>.<size>``."""
        return f"{self.sku}.{self.size}"

    def __str__(self) -> str:
        return f"{self.region}.{self.hall}.{self.sku}.{self.size}"
