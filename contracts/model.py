"""The contract: the only way a workload may run on reclaimable capacity.

Strict models: unknown fields are refused, types are not coerced. One contract per file
in the contract repository; the compiler validates them, checks feasibility against the
regions, and signs the result into a bundle.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
    model_validator,
)

from contracts.disruption import Disruption
from contracts.drain_terms import (
    CONTRACT_LABEL as CONTRACT_LABEL,
)
from contracts.drain_terms import (
    SLURM_TAG_PREFIX as SLURM_TAG_PREFIX,
)
from contracts.drain_terms import DrainAction as DrainAction
from contracts.drain_terms import EarlyWarningAction as EarlyWarningAction
from contracts.drain_terms import contract_tag_in_comment as contract_tag_in_comment
from contracts.drain_terms import slurm_tag
from contracts.headroom import MAX_HEADROOM_SCHEDULES, HeadroomSchedule
from contracts.pool_id import Size

Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
LabelValue = Annotated[
    str, StringConstraints(pattern=r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
]
LabelKey = Annotated[
    str,
    StringConstraints(
        pattern=r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
    ),
]
SlurmName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class WorkloadKind(enum.StrEnum):
    SPARK = "spark"
    TRAINING = "training"
    CI = "ci"
    SERVICE = "service"


#: The drain a kind normally wants; another choice is allowed but reported as a warning.
USUAL_DRAIN: dict[WorkloadKind, DrainAction] = {
    WorkloadKind.SPARK: DrainAction.DECOMMISSION,
    WorkloadKind.TRAINING: DrainAction.CHECKPOINT,
    WorkloadKind.CI: DrainAction.REQUEUE,
    WorkloadKind.SERVICE: DrainAction.REQUEUE,
}


class KubernetesSelector(_Strict):
    """Pods in `namespace` whose labels include every pair of `labels`."""

    namespace: Name
    labels: dict[LabelKey, LabelValue] = {}


class SlurmSelector(_Strict):
    """Jobs of `account` on `partition` carrying `--comment=sco-contract=<tag>`."""

    account: SlurmName
    partition: SlurmName
    tag: Name | None = None  # default: the contract's name


class Selectors(_Strict):
    kubernetes: list[KubernetesSelector] = []
    slurm: list[SlurmSelector] = []

    @model_validator(mode="after")
    def _at_least_one(self) -> Selectors:
        if not self.kubernetes and not self.slurm:
            raise ValueError("a contract needs at least one kubernetes or slurm selector")
        return self


class UnitShape(_Strict):
    """One normalised demand unit: what one unit of this workload needs."""

    vcpu: int = Field(gt=0, le=512)
    memory_gib: int = Field(gt=0, le=8192)
    gpus: int = Field(default=0, ge=0, le=16)


class Placement(_Strict):
    skus: list[Name] = Field(min_length=1)
    sizes: list[Size] = Field(min_length=1)
    halls: list[Annotated[str, StringConstraints(pattern=r"^[A-Z]$")]] = Field(min_length=1)
    max_units_per_region: int = Field(ge=0)
    max_pool_share: float = Field(gt=0, le=1)  # of one pool's reclaimable units
    spread_groups: list[Name] = []  # contracts sharing a group are spread over pools together


class Drain(_Strict):
    action: DrainAction
    grace_seconds: int = Field(gt=0, le=3600)
    checkpoint_uri: Annotated[str, StringConstraints(pattern=r"^(s3|file)://\S+$")] | None = None
    early_warning: EarlyWarningAction = EarlyWarningAction.NONE

    @model_validator(mode="after")
    def _checkpoint_needs_target(self) -> Drain:
        if self.action is DrainAction.CHECKPOINT and self.checkpoint_uri is None:
            raise ValueError("checkpoint_uri is required when action is checkpoint")
        early = self.early_warning
        if early is not EarlyWarningAction.NONE and early.value != self.action.value:
            raise ValueError(
                f"early_warning: {early.value} needs action {early.value} (the workload's "
                f"adapter does it), this drain's action is {self.action.value}"
            )
        return self

    @model_serializer(mode="wrap")
    def _no_early_warning_when_none(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, object]:
        # Without an opt-in a contract's bundle bytes stay those from before the field, so
        # agents that predate it keep accepting bundles (they forbid unknown fields).
        out: dict[str, object] = handler(self)
        if self.early_warning is EarlyWarningAction.NONE:
            out.pop("early_warning", None)
        return out


class Contract(_Strict):
    name: Name
    owner: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    tier: int = Field(ge=1, le=3)
    kind: WorkloadKind
    regions: list[Annotated[str, StringConstraints(pattern=r"^r[0-9]+$")]] = Field(min_length=1)
    selectors: Selectors
    unit: UnitShape
    placement: Placement
    # Units on committed capacity per region; tier 1 only.
    floor: dict[str, int] = {}
    drain: Drain
    # Money per hour (the region's currency) that committed fallback may cost without an
    # operator's approval.
    max_fallback_spend_per_hour: float = Field(ge=0)
    # How much SCO may disrupt of this contract at once, when, and the maximum instance
    # age (contracts/disruption.py); absent: the default budget, no blackouts, no expiry.
    disruption: Disruption | None = None
    # Units per region held as ready instances beyond demand, counted by the planner as
    # cover: a burst starts without a boot.
    headroom_units: int = Field(default=0, ge=0, le=100_000)
    # Each replaces headroom_units while its cron window is open (contracts/headroom.py).
    headroom_schedules: list[HeadroomSchedule] = Field(
        default=[], max_length=MAX_HEADROOM_SCHEDULES
    )

    @model_validator(mode="after")
    def _headroom_within_cap(self) -> Contract:
        cap = self.placement.max_units_per_region
        if self.headroom_units > cap:
            raise ValueError(
                f"headroom_units: {self.headroom_units} is over placement.max_units_per_region"
                f" ({cap})"
            )
        for n, sched in enumerate(self.headroom_schedules):
            if sched.units > cap:
                raise ValueError(
                    f"headroom_schedules[{n}].units: {sched.units} is over "
                    f"placement.max_units_per_region ({cap})"
                )
        return self

    @model_serializer(mode="wrap")
    def _no_lifecycle_fields_when_unset(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, object]:
        # A contract that uses none of them keeps its bundle bytes from before the fields,
        # so agents that predate them (they forbid unknown fields) keep accepting bundles.
        out: dict[str, object] = handler(self)
        if self.disruption is None:
            out.pop("disruption", None)
        if self.headroom_units == 0:
            out.pop("headroom_units", None)
        if not self.headroom_schedules:
            out.pop("headroom_schedules", None)
        return out

    @property
    def disruption_or_default(self) -> Disruption:
        return self.disruption if self.disruption is not None else Disruption()

    @model_validator(mode="after")
    def _floor_rules(self) -> Contract:
        if self.floor and self.tier != 1:
            raise ValueError("floor: only tier 1 contracts have a guaranteed floor")
        for region, units in self.floor.items():
            if region not in self.regions:
                raise ValueError(f"floor: region {region} is not in this contract's regions")
            if units < 0:
                raise ValueError(f"floor: {region}: units must be >= 0")
        return self

    def slurm_tag(self, selector: SlurmSelector) -> str:
        return slurm_tag(self.name, selector.tag)
