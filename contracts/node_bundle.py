"""A bundle as a node reads it: the terms it acts on, without pydantic (decision 0041).

The compiler validated every contract against the full model (contracts/model.py) before
it signed the bundle, and `signed_bundle.open_signed` has checked that signature and the
canonical form, so a node reads only what it acts on, with its types: each contract's
name, selectors and drain, and the notice policies. The sections a node acts on are read
strictly (an unknown field in `drain` or `selectors` is refused: it could be a term this
node does not know how to honour); the rest of a contract (placement, unit, floor, ...) is
the control plane's and is not read here. `tests/contracts/test_node_bundle.py` checks
that this reading agrees with the full model's over the example contracts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from contracts.drain_terms import DrainAction, EarlyWarningAction, slurm_tag
from contracts.notice import NoticePolicy
from contracts.records import Reader, RecordError, aware, read
from contracts.signed_bundle import FORMAT, MAX_SERIAL, BundleRejected, VerifiedBundle


@dataclass(frozen=True)
class NodeKubernetesSelector:
    namespace: str
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: object, where: str) -> NodeKubernetesSelector:
        return read(doc, where, lambda r: cls(r.text("namespace"), r.text_map("labels")))


@dataclass(frozen=True)
class NodeSlurmSelector:
    account: str
    partition: str
    tag: str | None = None

    @classmethod
    def from_json(cls, doc: object, where: str) -> NodeSlurmSelector:
        return read(
            doc, where, lambda r: cls(r.text("account"), r.text("partition"), r.opt_text("tag"))
        )


@dataclass(frozen=True)
class NodeSelectors:
    kubernetes: list[NodeKubernetesSelector] = field(default_factory=list)
    slurm: list[NodeSlurmSelector] = field(default_factory=list)

    @classmethod
    def from_json(cls, doc: object, where: str) -> NodeSelectors:
        return read(
            doc,
            where,
            lambda r: cls(
                r.array("kubernetes", NodeKubernetesSelector.from_json),
                r.array("slurm", NodeSlurmSelector.from_json),
            ),
        )


@dataclass(frozen=True)
class NodeDrain:
    action: DrainAction
    grace_seconds: int
    checkpoint_uri: str | None = None
    early_warning: EarlyWarningAction = EarlyWarningAction.NONE

    @classmethod
    def from_json(cls, doc: object, where: str) -> NodeDrain:
        return read(
            doc,
            where,
            lambda r: cls(
                r.choice("action", DrainAction),
                r.integer("grace_seconds"),
                r.opt_text("checkpoint_uri"),
                r.choice("early_warning", EarlyWarningAction, EarlyWarningAction.NONE),
            ),
        )


@dataclass(frozen=True)
class NodeContract:
    """The part of a contract a node drains by."""

    name: str
    selectors: NodeSelectors
    drain: NodeDrain

    @classmethod
    def from_json(cls, doc: object, where: str) -> NodeContract:
        r = Reader(doc, where)
        return cls(
            r.text("name"),
            NodeSelectors.from_json(r.raw("selectors"), r.at("selectors")),
            NodeDrain.from_json(r.raw("drain"), r.at("drain")),
        )  # the rest of the contract is the control plane's: not read, not refused

    def slurm_tag(self, selector: NodeSlurmSelector) -> str:
        return slurm_tag(self.name, selector.tag)


@dataclass(frozen=True)
class NodeBundle:
    """A bundle's content as a node reads it (contracts.bundle.BundleContent's terms)."""

    serial: int
    created_at: datetime
    regions: list[str]
    contracts: list[NodeContract]
    notice_policies: list[NoticePolicy] = field(default_factory=list)

    def notice_policy(self, region: str) -> NoticePolicy | None:
        return next((p for p in self.notice_policies if p.region == region), None)

    def contract(self, name: str) -> NodeContract | None:
        return next((c for c in self.contracts if c.name == name), None)


def _policy(doc: object, where: str) -> NoticePolicy:
    return NoticePolicy.from_json(doc, where)


def parse_node_content(doc: dict[str, Any]) -> NodeBundle:
    """Signed content as a node reads it; BundleRejected naming the field otherwise."""
    r = Reader(doc, "", allowed=("source",))  # source: which commit, for operators
    try:
        if r.integer("format", FORMAT) != FORMAT:
            raise RecordError("format", f"expected {FORMAT}")
        serial = r.integer("serial")
        if not 1 <= serial <= MAX_SERIAL:
            raise RecordError("serial", f"expected 1 to {MAX_SERIAL}")
        content = NodeBundle(
            serial=serial,
            created_at=aware(r.when("created_at"), "created_at"),
            regions=r.texts("regions"),
            contracts=r.array("contracts", NodeContract.from_json),
            notice_policies=r.array("notice_policies", _policy),
        )
        r.done()
    except RecordError as exc:
        raise BundleRejected(f"signed content does not match the bundle format: {exc}") from None
    return content


#: A bundle a node verified and read (the cache's default reading).
NodeVerifiedBundle = VerifiedBundle[NodeBundle]
