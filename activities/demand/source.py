"""The one interface every scheduler's pending-work reader implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from activities.demand.model import PendingWork


class SourceUnavailable(RuntimeError):
    """The scheduler could not be read (down, refused, unparseable answer).

    The intake keeps that source's last demand rather than dropping it to zero: a scheduler
    outage must not make the controllers release capacity that work is waiting for.
    """

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason


@runtime_checkable
class DemandSource(Protocol):
    #: The `demand.source` value of this source's rows ("slurm", "kubernetes").
    name: str

    async def pending(self) -> list[PendingWork]:
        """Every pending job or pod now; raises SourceUnavailable when it cannot tell."""
        ...
