"""The planner's inputs and outputs, and how they are built from contracts and regions.

Frozen pydantic models: they cross Temporal's data converter inside workflow inputs and
activity results. The cost model and the solver are in `planner`.
"""

from __future__ import annotations

from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, field_validator

from contracts import feasibility
from contracts.model import Contract
from contracts.region import Pool, Region
from planning.costs import RESTART_COST_HOURS, expected_cost, owner_load_rate


class PoolInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    pool_id: str
    hall: str
    sku: str
    size: str
    vcpu: int = Field(gt=0)
    memory_gib: int = Field(gt=0)
    gpus: int = Field(default=0, ge=0)
    price_per_hour: float = Field(gt=0, allow_inf_nan=False)  # per instance-hour
    reclaimable_units: int = Field(ge=0)  # pool size in instances
    free: int = Field(ge=0)  # instances that can start now
    reclaim_rate: float = Field(default=0.0, ge=0, allow_inf_nan=False)  # per instance-hour
    excluded: bool = False  # by the pool exclusion cycle: never used for new instances
    # Reclaims per instance-hour expected from the owner's load at this free share
    # (planning.costs.owner_load_rate), on top of the observed reclaim_rate.
    load_rate: float = Field(default=0.0, ge=0, allow_inf_nan=False)


class ContractDemand(BaseModel):
    model_config = ConfigDict(frozen=True)

    contract: str
    kind: str  # a WorkloadKind value
    unit_vcpu: int = Field(gt=0)
    unit_memory_gib: int = Field(gt=0)
    unit_gpus: int = Field(default=0, ge=0)
    skus: list[str]
    sizes: list[str]
    halls: list[str]
    demand_units: int = Field(ge=0)  # total wanted, including what is already held
    max_units_per_region: int = Field(ge=0)
    max_pool_share: float = Field(gt=0, le=1)
    spread_groups: list[str] = []
    existing: dict[str, NonNegativeInt] = {}  # pool_id -> instances already held there

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        if kind not in RESTART_COST_HOURS:
            raise ValueError(f"unknown workload kind {kind!r}; known: {sorted(RESTART_COST_HOURS)}")
        return kind


class LoadRisk(BaseModel):
    """How the planner prices the owner's load (planning.costs.owner_load_rate): a pool
    with nothing free is expected to be reclaimed ``full_rate`` times per instance-hour,
    one with at least ``free_share`` free not at all. ``full_rate`` 0: off."""

    model_config = ConfigDict(frozen=True)

    full_rate: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    free_share: float = Field(default=0.5, gt=0, le=1)


class PlanInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    contracts: list[ContractDemand]
    pools: list[PoolInput]
    spread_max_pool_fraction: float = Field(default=0.25, gt=0, le=1)


class Allocation(BaseModel):
    model_config = ConfigDict(frozen=True)

    contract: str
    pool_id: str
    hall: str
    instances: int  # new instances to launch
    # Demand units those instances cover: instances * units per instance, except that the
    # last instance may be partly used (the contract needs no more, or a spread cap).
    units: int
    cost_per_hour: float  # risk-adjusted expected cost of these instances


class ContractOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    contract: str
    demand_units: int
    target_units: int  # min(demand, max_units_per_region)
    held_units: int  # covered by existing instances
    planned_units: int  # covered by new allocations
    shortfall_units: int  # target - held - planned: reclaimable capacity cannot cover it
    surplus_units: int  # held beyond target (the controller may release)


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)

    allocations: list[Allocation]  # sorted by (contract, pool_id); instances > 0 only
    outcomes: list[ContractOutcome]  # sorted by contract
    cost_per_hour: float  # sum over allocations


# --- building inputs from the contract and region models --------------------------------


def contract_demand(
    contract: Contract, region: str, demand_units: int, existing: dict[str, int] | None = None
) -> ContractDemand:
    """The planner's view of ``contract`` in ``region``.

    A contract that does not list ``region`` gets a cap of 0 there: it is planned nothing,
    and whatever it still holds in the region is reported as surplus.
    """
    p = contract.placement
    return ContractDemand(
        contract=contract.name,
        kind=contract.kind.value,
        unit_vcpu=contract.unit.vcpu,
        unit_memory_gib=contract.unit.memory_gib,
        unit_gpus=contract.unit.gpus,
        skus=list(p.skus),
        sizes=list(p.sizes),
        halls=list(p.halls),
        demand_units=demand_units,
        max_units_per_region=p.max_units_per_region if region in contract.regions else 0,
        max_pool_share=p.max_pool_share,
        spread_groups=list(p.spread_groups),
        existing=dict(existing or {}),
    )


def pool_input(
    region: Region,
    pool: Pool,
    *,
    free: int,
    reclaim_rate: float = 0.0,
    excluded: bool = False,
    load: LoadRisk | None = None,
) -> PoolInput:
    """The planner's view of one pool of ``region``, with its live free capacity and, with
    ``load``, the reclaims its free share lets one expect from the owner's load."""
    return PoolInput(
        pool_id=region.pool_id(pool),
        hall=pool.hall,
        sku=pool.sku,
        size=pool.size,
        vcpu=pool.vcpu,
        memory_gib=pool.memory_gib,
        gpus=pool.gpus,
        price_per_hour=pool.price_per_hour,
        reclaimable_units=pool.reclaimable_units,
        free=free,
        reclaim_rate=reclaim_rate,
        excluded=excluded,
        load_rate=0.0
        if load is None
        else owner_load_rate(free, pool.reclaimable_units, load.full_rate, load.free_share),
    )


class _Unit(NamedTuple):
    vcpu: int
    memory_gib: int
    gpus: int


def units_per_instance(demand: ContractDemand, pool: PoolInput) -> int:
    """Demand units of ``demand`` one instance of ``pool`` holds (0: a unit does not fit):
    the contract layer's arithmetic, on the planner's serialisable models."""
    unit = _Unit(demand.unit_vcpu, demand.unit_memory_gib, demand.unit_gpus)
    return feasibility.units_per_instance(unit, pool)


def risk_cost(pool: PoolInput, kind: str) -> float:
    """Risk-adjusted expected cost of one instance-hour of ``pool`` for a ``kind`` workload:
    the reclaims observed and those the owner's load lets one expect."""
    return expected_cost(pool.price_per_hour, pool.reclaim_rate + pool.load_rate, kind)
