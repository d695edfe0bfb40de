"""Contracts from git (`sco contracts sync`): each new commit on the ref, signature checked,
compiled, signed and published, one serial per commit.

One `step` fetches the ref from the first remote that answers (primary, then mirrors) and
walks the commits after the last published one (first-parent, oldest first):
- a commit not signed by a key of the trust directory's `allowed_signers` is refused (the
  reason and the key named) and nothing is published for it; a later signed commit on top
  vouches for its own tree and is published;
- a commit that does not compile publishes nothing; the last good bundle stays; the
  findings name the commit, file, line and reason;
- a compiled commit is published with the next serial (the published bundle's + 1), its
  commit id and signer in the bundle (`BundleSource`). A revert is a new commit: a new,
  higher serial with the old content. Serials never go down.
- when the last published commit is not in the new head's history (a force-push rewrote
  it), nothing is published until an operator approves that head
  (`sco contracts approve-rewrite COMMIT`).
- when the notice keys (`notice_keys_dir`: a relay key added by `sco keys relay-new`, one
  retired, or one past its `not_after`) no longer match the published bundle's, the
  published commit is compiled again and published with the next serial: a key rotation
  needs no contracts commit, and a retired key leaves the bundle once its time has come.

State lives beside the bundle, in the region's NATS (`SyncStore`): the published bundle says
its serial and commit; the commits bucket maps serials to commits for `sco contracts status`
and holds approvals. A restarted sync picks up where the bundle says.

Migration: a repository made by `sco contracts import` has a first commit with the trailer
`SCO-Serial: N`, the serial of the bundle in use; when the published bundle came from a
directory (no commit) and has that serial, the commit is adopted as serial N, not published
again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import nats
from nacl.signing import SigningKey
from nats.js.api import KeyValueConfig
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NoKeysError

from contracts import bundle
from contracts.bundle import BundleRejected, BundleSource
from contracts.compiler import compile_and_sign, load_region_dir, notice_policies
from contracts.distribution import NatsBundleSource, publish
from contracts.findings import Finding, errors
from contracts.gitrepo import ALLOWED_SIGNERS_FILE, Fetched, GitError, GitMirror, Signature
from contracts.keys import TrustStore
from contracts.notice import NoticePolicy

log = logging.getLogger(__name__)

SERIAL_TRAILER = "SCO-Serial"


class Outcome(StrEnum):
    PUBLISHED = "published"
    ADOPTED = "adopted"  # the import commit, kept at the bundle's serial
    REFUSED_SIGNATURE = "refused-signature"
    COMPILE_ERROR = "compile-error"
    REWRITE_REFUSED = "rewrite-refused"


@dataclass(frozen=True)
class Held:
    """What the region runs: the published bundle's serial and the commit it came from."""

    serial: int
    commit: str | None  # None: compiled from a directory, not from git
    signer: str = ""
    # The published bundle's notice keys: the sync republishes when the directory differs.
    notice_policies: tuple[NoticePolicy, ...] = ()


@dataclass(frozen=True)
class CommitRecord:
    serial: int
    commit: str
    signer: str
    remote: str
    at: str

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> CommitRecord:
        doc = json.loads(raw)
        return cls(
            int(doc["serial"]),
            str(doc["commit"]),
            str(doc["signer"]),
            str(doc.get("remote", "")),
            str(doc.get("at", "")),
        )


class SyncStore(Protocol):
    """Where the sync publishes and keeps its state (NATS in production)."""

    async def held(self) -> Held | None:
        """The published bundle (verified); None when nothing is published."""

    async def publish(self, raw: bytes) -> None: ...

    async def record(self, rec: CommitRecord) -> None:
        """Remember which commit `rec.serial` came from (adoptions included)."""

    async def commit_of(self, serial: int) -> CommitRecord | None: ...

    async def approved_rewrite(self) -> str | None:
        """The head commit an operator approved a history rewrite for, if any."""


@dataclass(frozen=True)
class CommitResult:
    commit: str
    outcome: Outcome
    serial: int | None = None
    signer: str = ""
    key: str = ""
    reason: str = ""
    findings: tuple[Finding, ...] = ()

    def describe(self) -> str:
        short = self.commit[:12]
        if self.outcome is Outcome.PUBLISHED:
            why = f": {self.reason}" if self.reason else ""
            return f"{short}: published serial {self.serial} (signed by {self.signer}){why}"
        if self.outcome is Outcome.ADOPTED:
            return f"{short}: adopted as serial {self.serial} (imported, not republished)"
        if self.outcome is Outcome.COMPILE_ERROR:
            lines = "; ".join(str(f) for f in errors(list(self.findings)))
            return f"{short}: compile error, nothing published: {lines}"
        return f"{short}: REFUSED: {self.reason}"


@dataclass
class SyncReport:
    fetched: Fetched | None
    results: list[CommitResult] = field(default_factory=list)
    held: Held | None = None  # after the step
    head_ok: bool = True  # the head is what the region runs (nothing refused or failing)
    behind: bool = False  # the remote's head is older than the published commit

    @property
    def compile_failing(self) -> bool:
        return bool(self.results) and self.results[-1].outcome is Outcome.COMPILE_ERROR


@dataclass(frozen=True)
class SyncConfig:
    remotes: tuple[str, ...]  # primary first, then mirrors
    ref: str
    path: str  # the contracts folder in the repository
    mirror_dir: Path  # the local bare mirror
    trust_dir: Path  # holds allowed_signers (and the bundle keys' .pub)
    regions_dir: Path
    signing_key: SigningKey
    notice_keys_dir: Path | None = None


class ContractSync:
    def __init__(
        self,
        config: SyncConfig,
        store: SyncStore,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.config = config
        self.store = store
        self.git = GitMirror(config.mirror_dir)
        self._now = now
        #: Verdicts already reported, so a refused commit is counted once, not every step.
        self.seen: dict[str, CommitResult] = {}
        #: The notice keys' errors already reported (a broken scopes.yaml: once, not every step).
        self._rekey_failed: tuple[str, ...] = ()

    @property
    def allowed_signers(self) -> Path:
        return self.config.trust_dir / ALLOWED_SIGNERS_FILE

    async def step(self) -> SyncReport:
        """One fetch and what follows; raises GitError (RemotesUnreachable) and the
        store's errors (NATS down): nothing was published past the last result then."""
        cfg = self.config
        # git runs in threads: the process's loop keeps serving meanwhile.
        fetched = await asyncio.to_thread(self.git.fetch, cfg.remotes, cfg.ref)
        report = SyncReport(fetched)
        held = await self.store.held()
        last_commit = await self._last_commit(held)
        head = fetched.head
        if last_commit == head:
            report.held = held
            rekeyed = await self._rekey(head, held, fetched) if held is not None else None
            if rekeyed is not None:
                report.results.append(rekeyed)
                if rekeyed.outcome is Outcome.PUBLISHED and rekeyed.serial is not None:
                    report.held = Held(rekeyed.serial, head, rekeyed.signer)
            return report
        if last_commit is not None and await asyncio.to_thread(
            self.git.is_ancestor, head, last_commit
        ):
            # A mirror that has not caught up yet: nothing new, nothing rewritten.
            report.held, report.behind = held, True
            return report
        if last_commit is not None and not await asyncio.to_thread(
            self.git.is_ancestor, last_commit, head
        ):
            if await self.store.approved_rewrite() != head:
                reason = (
                    f"history rewritten: the published commit {last_commit[:12]} is not an "
                    f"ancestor of {head[:12]} (approve with `sco contracts approve-rewrite {head}`)"
                )
                report.results.append(CommitResult(head, Outcome.REWRITE_REFUSED, reason=reason))
                report.held, report.head_ok = held, False
                return report
            commits = [head]
        else:
            commits = await asyncio.to_thread(self.git.new_commits, last_commit, head)
        for commit in commits:
            result = await self._one(commit, held, fetched)
            report.results.append(result)
            if result.outcome in (Outcome.PUBLISHED, Outcome.ADOPTED):
                assert result.serial is not None
                held = Held(result.serial, commit, result.signer)
        report.held = held
        report.head_ok = bool(report.results) and report.results[-1].outcome in (
            Outcome.PUBLISHED,
            Outcome.ADOPTED,
        )
        return report

    async def _last_commit(self, held: Held | None) -> str | None:
        if held is None:
            return None
        if held.commit is not None:
            return held.commit
        rec = await self.store.commit_of(held.serial)  # adopted by an import
        return rec.commit if rec is not None else None

    async def _one(self, commit: str, held: Held | None, fetched: Fetched) -> CommitResult:
        if commit in self.seen:  # refused or failing before: the same verdict, no recompile
            return self.seen[commit]
        sig: Signature = await asyncio.to_thread(self.git.verify, commit, self.allowed_signers)
        if not sig.good:
            return self._seen(
                CommitResult(
                    commit,
                    Outcome.REFUSED_SIGNATURE,
                    key=sig.key,
                    reason=f"commit {commit[:12]} refused: {sig.reason}",
                )
            )
        imported = await asyncio.to_thread(self.git.trailer, commit, SERIAL_TRAILER)
        if held is not None and held.commit is None and imported == str(held.serial):
            rec = CommitRecord(held.serial, commit, sig.signer, fetched.remote, self._stamp())
            await self.store.record(rec)
            return CommitResult(commit, Outcome.ADOPTED, held.serial, sig.signer, sig.key)
        serial = (held.serial if held is not None else 0) + 1
        if imported is not None and imported.isdigit():
            serial = max(serial, int(imported))
        raw, failed = await asyncio.to_thread(self._compile, commit, sig, serial, fetched)
        if raw is None:
            return self._seen(failed)
        # The serial's commit is recorded before its bundle is out: whoever sees the bundle
        # (`sco contracts status`, a node reporting the serial) finds its commit. A publish
        # that fails leaves a record the next round's put of the same serial replaces.
        await self.store.record(
            CommitRecord(serial, commit, sig.signer, fetched.remote, self._stamp())
        )
        await self.store.publish(raw)
        await asyncio.to_thread(self.git.keep, commit)
        return CommitResult(commit, Outcome.PUBLISHED, serial, sig.signer, sig.key)

    async def _rekey(self, head: str, held: Held, fetched: Fetched) -> CommitResult | None:
        """The published commit again, with the next serial, when the notice keys no longer
        match the published bundle's; None when they do (or there is nothing to do)."""
        cfg = self.config
        if cfg.notice_keys_dir is None or held.commit != head:
            return None
        regions, problems = load_region_dir(cfg.regions_dir)
        if problems:
            return None  # the next commit's compile reports them
        now = self._now()
        policies, findings = await asyncio.to_thread(
            notice_policies, cfg.notice_keys_dir, regions, now
        )
        failing = tuple(str(f) for f in errors(findings))
        if failing:
            if failing == self._rekey_failed:
                return None
            self._rekey_failed = failing
            return CommitResult(
                head, Outcome.COMPILE_ERROR, signer=held.signer, findings=tuple(errors(findings))
            )
        self._rekey_failed = ()
        if sorted(policies, key=lambda p: p.region) == list(held.notice_policies):
            return None
        sig: Signature = await asyncio.to_thread(self.git.verify, head, self.allowed_signers)
        if not sig.good:
            return None  # published when it verified; a new allowed_signers is a commit's matter
        raw, failed = await asyncio.to_thread(self._compile, head, sig, held.serial + 1, fetched)
        if raw is None:
            return failed
        serial = held.serial + 1
        await self.store.record(  # before the bundle, as in a commit's publish
            CommitRecord(serial, head, sig.signer, fetched.remote, self._stamp())
        )
        await self.store.publish(raw)
        log.info("notice keys changed: commit %s republished as serial %d", head[:12], serial)
        return CommitResult(
            head, Outcome.PUBLISHED, serial, sig.signer, sig.key, reason="notice keys changed"
        )

    def _compile(
        self, commit: str, sig: Signature, serial: int, fetched: Fetched
    ) -> tuple[bytes | None, CommitResult]:
        """The signed bundle of `commit`, or None and the compile error."""
        cfg = self.config
        source = BundleSource(
            commit=commit,
            signer=sig.signer,
            signer_key=sig.key,
            remote=fetched.remote,
            ref=cfg.ref,
            path=cfg.path,
        )
        with tempfile.TemporaryDirectory(prefix="sco-contracts-") as tmp:
            root = Path(tmp) / "tree"
            try:
                src = self.git.export(commit, cfg.path, root / cfg.path.strip("/"))
            except GitError as exc:
                missing = Finding(cfg.path, 1, "(directory)", f"not in commit {commit[:12]}: {exc}")
                return None, CommitResult(
                    commit, Outcome.COMPILE_ERROR, signer=sig.signer, findings=(missing,)
                )
            out = Path(tmp) / "bundle.json"
            result, written = compile_and_sign(
                src,
                cfg.regions_dir,
                cfg.signing_key,
                out,
                serial=serial,
                created_at=self._now(),
                notice_keys_dir=cfg.notice_keys_dir,
                source=source,
            )
            findings = tuple(_relative(f, root) for f in result.findings)
            if written is None:
                failed = CommitResult(
                    commit, Outcome.COMPILE_ERROR, signer=sig.signer, findings=findings
                )
                return None, failed
            return out.read_bytes(), CommitResult(commit, Outcome.PUBLISHED, serial, sig.signer)

    def _seen(self, result: CommitResult) -> CommitResult:
        return self.seen.setdefault(result.commit, result)

    def _stamp(self) -> str:
        return self._now().astimezone(UTC).isoformat()


def _relative(f: Finding, root: Path) -> Finding:
    try:
        return replace(f, file=str(Path(f.file).relative_to(root)))
    except ValueError:
        return f


def commits_bucket(region: str) -> str:
    return f"sco-contract-commits-{region}"


APPROVAL_KEY = "approved-rewrite"


class NatsSyncStore:
    """The region's bundle bucket (contracts/distribution.py) and its commits bucket."""

    def __init__(
        self,
        nats_url: str,
        region: str,
        trust_dir: Path,
        connect_options: dict[str, Any] | None = None,
    ) -> None:
        self._url = nats_url
        self._region = region
        self._trust_dir = trust_dir
        self._options = connect_options or {}

    async def held(self) -> Held | None:
        raw = await NatsBundleSource(self._url, self._region, self._options).fetch()
        if raw is None:
            return None
        try:
            b = bundle.verify(raw, TrustStore.load(self._trust_dir), max_age=_FOREVER)
        except BundleRejected as exc:
            # Not ours to replace silently: a bundle nodes would refuse is an operator matter.
            raise RuntimeError(f"the published bundle does not verify: {exc}") from exc
        src = b.content.source
        return Held(
            b.serial,
            src.commit if src else None,
            src.signer if src else "",
            tuple(b.content.notice_policies),
        )

    async def publish(self, raw: bytes) -> None:
        await publish(self._url, self._region, raw, self._options)

    async def _kv(self, nc: Any) -> Any:
        js = nc.jetstream()
        try:
            return await js.key_value(commits_bucket(self._region))
        except BucketNotFoundError:
            return await js.create_key_value(
                KeyValueConfig(
                    bucket=commits_bucket(self._region),
                    description="SCO: the git commit of each contract bundle serial",
                    history=1,
                )
            )

    async def _connect(self) -> Any:
        return await nats.connect(
            self._url, connect_timeout=5, max_reconnect_attempts=1, **self._options
        )

    async def record(self, rec: CommitRecord) -> None:
        nc = await self._connect()
        try:
            await (await self._kv(nc)).put(f"serial.{rec.serial}", rec.to_json())
        finally:
            await nc.close()

    async def commit_of(self, serial: int) -> CommitRecord | None:
        return (await self.commits([serial])).get(serial)

    async def commits(self, serials: list[int]) -> dict[int, CommitRecord]:
        nc = await self._connect()
        out: dict[int, CommitRecord] = {}
        try:
            kv = await self._kv(nc)
            for serial in sorted(set(serials)):
                try:
                    entry = await kv.get(f"serial.{serial}")
                except KeyNotFoundError:
                    continue
                if entry.value:
                    out[serial] = CommitRecord.from_json(entry.value)
            return out
        finally:
            await nc.close()

    async def approved_rewrite(self) -> str | None:
        nc = await self._connect()
        try:
            try:
                entry = await (await self._kv(nc)).get(APPROVAL_KEY)
            except (KeyNotFoundError, NoKeysError):
                return None
            return json.loads(entry.value)["commit"] if entry.value else None
        finally:
            await nc.close()

    async def approve_rewrite(self, commit: str, by: str, reason: str) -> None:
        nc = await self._connect()
        try:
            doc = {
                "commit": commit,
                "by": by,
                "reason": reason,
                "at": datetime.now(UTC).isoformat(),
            }
            await (await self._kv(nc)).put(APPROVAL_KEY, json.dumps(doc).encode())
        finally:
            await nc.close()


_FOREVER = timedelta(days=3650)  # age does not matter here: the serial and commit do
