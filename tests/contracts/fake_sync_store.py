"""An in-memory `SyncStore` (contracts/gitsync.py): what the sync published and recorded."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from contracts import bundle
from contracts.gitsync import CommitRecord, Held, SyncStore
from contracts.keys import TrustStore


class FakeSyncStore:
    def __init__(self, current: bytes | None, trust_dir: Path) -> None:
        self.current = current
        self.trust_dir = trust_dir
        self.published: list[bytes] = []
        self.records: dict[int, CommitRecord] = {}
        self.approved: str | None = None

    async def held(self) -> Held | None:
        if self.current is None:
            return None
        b = bundle.verify(
            self.current, TrustStore.load(self.trust_dir), max_age=timedelta(days=3650)
        )
        src = b.content.source
        return Held(
            b.serial,
            src.commit if src else None,
            src.signer if src else "",
            tuple(b.content.notice_policies),
        )

    async def publish(self, raw: bytes) -> None:
        # The real store is read by others the moment a bundle is out (`sco contracts
        # status` looks up the serial's commit): the sync records the commit first.
        serial = bundle.verify(
            raw, TrustStore.load(self.trust_dir), max_age=timedelta(days=3650)
        ).serial
        assert serial in self.records, f"serial {serial} published before its commit recorded"
        self.published.append(raw)
        self.current = raw

    async def record(self, rec: CommitRecord) -> None:
        self.records[rec.serial] = rec

    async def commit_of(self, serial: int) -> CommitRecord | None:
        return self.records.get(serial)

    async def approved_rewrite(self) -> str | None:
        return self.approved


def _conforms(store: FakeSyncStore) -> SyncStore:
    return store  # mypy checks the fake against the Protocol here
