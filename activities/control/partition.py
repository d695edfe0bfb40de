"""Which controller partition owns a contract. Its own module, free of models: `sco demand
set` and Slurm's power programs import it on every call, and the snapshot models cost
them ~0.1 s of start-up (activities/control/models.py re-exports it)."""

from __future__ import annotations

import zlib


def partition_of(contract: str, partitions: int) -> int:
    """The controller partition that owns a contract (stable across processes)."""
    return zlib.crc32(contract.encode()) % partitions
