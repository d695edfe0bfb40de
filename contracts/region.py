"""The region model: halls, SKUs, reclaimable pools and committed capacity.

A region file (``deploy/regions/<id>.toml``) is the source of truth for what a region can
lend. Everything else (planner, acquirer, floor keeper, node agent) reads it through
:func:`load_region` / :func:`load_regions`, so a typo fails loudly here, with the file, the
field path and the reason, instead of surfacing later as "no capacity".

Units: prices in the region's currency per instance-hour (pools) or per vCPU-hour
(committed capacity), memory in GiB, times in seconds.

This module is part of the contract layer: it must not import ``workflows``,
``activities`` or ``workers``.
"""

from __future__ import annotations

import functools
import math
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from contracts.pool_id import NAME_RE, SIZES, PoolId, Size

__all__ = [
    "SIZES",
    "CommittedCapacity",
    "Pool",
    "Region",
    "RegionFileError",
    "Size",
    "Sku",
    "load_region",
    "load_regions",
]

# Instance sizes, smallest first. The OpenStack flavor of a pool is "<sku>.<size>".

_CURRENCY_RE = re.compile(r"[A-Z]{3}")


def _check_name(value: str) -> str:
    # Names are joined with dots into pool ids ("r1.A.gp.xl"), so a dot or a space in a
    # name would make ids ambiguous.
    if not NAME_RE.fullmatch(value):
        raise ValueError(
            "must be a non-empty name of letters, digits, '-' or '_' "
            "(it becomes part of pool ids like 'r1.A.gp.xl')"
        )
    return value


def _check_currency(value: str) -> str:
    if not _CURRENCY_RE.fullmatch(value):
        raise ValueError("must be an ISO 4217 code of three capital letters, e.g. 'EUR'")
    return value


Name = Annotated[str, AfterValidator(_check_name)]
Currency = Annotated[str, AfterValidator(_check_currency)]
# Money must be a real positive number: TOML allows inf and nan, which would poison sums.
Price = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Model(BaseModel):
    # strict: a quoted "8" is a mistake in a region file, not a number to coerce.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Sku(_Model):
    """An instance family; each SKU comes in the sizes of :data:`SIZES`."""

    name: Name
    description: str = Field(min_length=1)
    # Bare-metal SKUs are provisioned through Ironic instead of Nova's virtual machines.
    baremetal: bool
    # Set for GPU SKUs; then every pool of the SKU has gpus >= 1, otherwise gpus == 0.
    gpu_model: str | None = Field(default=None, min_length=1)


@functools.lru_cache(maxsize=4096)
def _pool_id_text(region: str, hall: str, sku: str, size: str) -> str:
    # The planner and the estate simulator ask for pool ids in inner loops, and PoolId
    # checks each part every time it is built; the ids of a few regions' pools are few.
    return str(PoolId(region=region, hall=hall, sku=sku, size=size))


class Pool(_Model):
    """Reclaimable capacity of one shape in one hall.

    A pool's identity is (region, hall, sku, size); the region is not repeated in each
    pool, use :meth:`pool_id` or :meth:`Region.pool_id`.
    """

    hall: Name
    sku: Name
    size: Size
    vcpu: int = Field(gt=0)
    memory_gib: int = Field(gt=0)
    gpus: int = Field(default=0, ge=0)
    # Internal reclaimable price per instance-hour, in the region's currency.
    price_per_hour: Price
    # How many instances of this shape the pool can lend; 0 is a pool that lends nothing.
    reclaimable_units: int = Field(ge=0)

    @property
    def flavor(self) -> str:
        """The OpenStack flavor name, e.g. ``gp.xl``."""
        return f"{self.sku}.{self.size}"

    @property
    def availability_zone(self) -> str:
        """The OpenStack availability zone: a hall is an AZ."""
        return self.hall

    def pool_id(self, region: str) -> str:
        """The pool id within ``region``, e.g. ``r1.A.gp.xl`` (:class:`PoolId`'s wire form)."""
        return _pool_id_text(region, self.hall, self.sku, self.size)

    def id_in(self, region: str) -> PoolId:
        """The pool's :class:`PoolId` within ``region``."""
        return PoolId(region=region, hall=self.hall, sku=self.sku, size=self.size)


class CommittedCapacity(_Model):
    """Committed (Blazar-reserved) capacity of one hall, used for floors and fallback."""

    vcpu: int = Field(gt=0)
    memory_gib: int = Field(gt=0)
    gpus: int = Field(default=0, ge=0)
    # Committed rate per vCPU-hour; must be above every reclaimable CPU pool's vCPU rate.
    price_per_vcpu_hour: Price


class Region(_Model):
    """One region: independent of the others, with its halls, SKUs, pools and floors."""

    id: Name
    # TOML arrays arrive as lists; let them become immutable tuples (items stay strict).
    halls: Annotated[tuple[Name, ...], Field(strict=False, min_length=1)]
    # Time between a reclaim notice and the instance going away.
    notice_lead_seconds: int = Field(gt=0)
    currency: Currency
    skus: Annotated[tuple[Sku, ...], Field(strict=False, min_length=1)]
    # Keyed by hall; a hall without committed capacity is simply absent.
    committed: Mapping[Name, CommittedCapacity]
    pools: Annotated[tuple[Pool, ...], Field(strict=False, min_length=1)]

    _pools_by_id: dict[str, Pool] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any, /) -> None:
        self._pools_by_id.update((self.pool_id(p), p) for p in self.pools)

    @model_validator(mode="wrap")
    @classmethod
    def _check_consistency(cls, data: Any, handler: ModelWrapValidatorHandler[Region]) -> Region:
        # Cross-field checks run on the raw input, next to (not after) field validation, so
        # one pass reports a negative vcpu *and* a pool in an unknown hall.
        problems = _consistency_problems(data)
        try:
            region = handler(data)
        except ValidationError as exc:
            if not problems:
                raise
            field_errors = [_as_init_error(err) for err in exc.errors()]
            raise ValidationError.from_exception_data(
                cls.__name__, field_errors + problems
            ) from None
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, problems)
        return region

    def pool_id(self, pool: Pool) -> str:
        """The id of one of this region's pools, e.g. ``r1.A.gp.xl``."""
        return pool.pool_id(self.id)

    def pool_ids(self) -> list[str]:
        """All pool ids, in file order."""
        return list(self._pools_by_id)

    def pool(self, pool_id: str) -> Pool:
        """The pool with this id; KeyError if the region has none."""
        try:
            return self._pools_by_id[pool_id]
        except KeyError:
            raise KeyError(
                f"no pool {pool_id!r} in region {self.id!r} "
                f"(pool ids look like '{self.id}.<hall>.<sku>.<size>')"
            ) from None

    def pools_in_hall(self, hall: str) -> list[Pool]:
        """The pools of one hall, in file order; KeyError for an unknown hall."""
        if hall not in self.halls:
            raise KeyError(f"no hall {hall!r} in region {self.id!r} (halls: {list(self.halls)})")
        return [p for p in self.pools if p.hall == hall]

    def sku(self, name: str) -> Sku:
        """The SKU with this name; KeyError if the region has none."""
        for sku in self.skus:
            if sku.name == name:
                return sku
        raise KeyError(f"no SKU {name!r} in region {self.id!r}")


# --- cross-field checks ---------------------------------------------------------------


def _get(entry: object, name: str) -> object:
    """A field of a raw mapping or of an already-built model; None if absent."""
    if isinstance(entry, Mapping):
        return entry.get(name)
    return getattr(entry, name, None)


def _items(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


def _number(value: object) -> float | None:
    """A finite int or float as float, else None (bools are not numbers here)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _problem(loc: tuple[str | int, ...], reason: str, value: object) -> InitErrorDetails:
    # The reason goes in as a context value so braces in it are not read as a template.
    return {
        "type": PydanticCustomError("region_consistency", "{reason}", {"reason": reason}),
        "loc": loc,
        "input": value,
    }


def _consistency_problems(data: object) -> list[InitErrorDetails]:
    """Problems that involve more than one field, tolerant of malformed entries.

    Entries whose fields have the wrong type are skipped here: field validation reports
    them already.
    """
    problems: list[InitErrorDetails] = []

    halls: set[str] = set()
    for i, hall in enumerate(_items(_get(data, "halls"))):
        if isinstance(hall, str):
            if hall in halls:
                problems.append(_problem(("halls", i), f"duplicate hall {hall!r}", hall))
            halls.add(hall)

    skus: dict[str, object] = {}
    for i, sku in enumerate(_items(_get(data, "skus"))):
        name = _get(sku, "name")
        if isinstance(name, str):
            if name in skus:
                problems.append(_problem(("skus", i, "name"), f"duplicate SKU {name!r}", name))
            skus.setdefault(name, sku)

    raw_committed = _get(data, "committed")
    committed = raw_committed if isinstance(raw_committed, Mapping) else {}
    for hall in committed:
        if isinstance(hall, str) and halls and hall not in halls:
            reason = f"committed capacity for hall {hall!r}, which is not one of {sorted(halls)}"
            problems.append(_problem(("committed", hall), reason, hall))

    seen: dict[tuple[str, str, str], int] = {}
    for i, pool in enumerate(_items(_get(data, "pools"))):
        hall, sku, size = _get(pool, "hall"), _get(pool, "sku"), _get(pool, "size")
        if isinstance(hall, str) and halls and hall not in halls:
            reason = f"hall {hall!r} is not one of the region's halls {sorted(halls)}"
            problems.append(_problem(("pools", i, "hall"), reason, hall))
        if isinstance(sku, str) and skus and sku not in skus:
            reason = f"SKU {sku!r} is not declared in skus {sorted(skus)}"
            problems.append(_problem(("pools", i, "sku"), reason, sku))
        if isinstance(hall, str) and isinstance(sku, str) and isinstance(size, str):
            key = (hall, sku, size)
            if key in seen:
                reason = (
                    f"duplicate pool {hall}.{sku}.{size}, already defined by pools[{seen[key]}]"
                )
                problems.append(_problem(("pools", i), reason, pool))
            seen.setdefault(key, i)

        gpus = _get(pool, "gpus")
        gpus = 0 if gpus is None else gpus  # the field's default
        gpu_model = _get(skus[sku], "gpu_model") if isinstance(sku, str) and sku in skus else None
        if isinstance(sku, str) and sku in skus and isinstance(gpus, int):
            if gpu_model is None and gpus > 0:
                reason = f"SKU {sku!r} has no gpu_model, so its pools must have gpus = 0"
                problems.append(_problem(("pools", i, "gpus"), reason, gpus))
            if gpu_model is not None and gpus == 0:
                reason = f"SKU {sku!r} is a GPU SKU ({gpu_model}), so its pools need gpus >= 1"
                problems.append(_problem(("pools", i, "gpus"), reason, gpus))

        # Reclaimable capacity must be cheaper than committed capacity, otherwise the
        # planner's preference for reclaimable pools (and the fallback arbiter) is upside
        # down. GPU pools carry a GPU premium, so only CPU pools are comparable per vCPU.
        price, vcpu = _number(_get(pool, "price_per_hour")), _number(_get(pool, "vcpu"))
        hall_committed = committed.get(hall) if isinstance(hall, str) else None
        rate = _number(_get(hall_committed, "price_per_vcpu_hour"))
        if gpus != 0 or gpu_model is not None:
            continue
        if price is None or not vcpu or vcpu <= 0 or rate is None:
            continue
        if price / vcpu >= rate:
            reason = (
                f"{price / vcpu:.4f} per vCPU-hour is not below hall {hall}'s committed "
                f"rate {rate}; reclaimable capacity must be cheaper than committed"
            )
            problems.append(_problem(("pools", i, "price_per_hour"), reason, price))
    return problems


def _as_init_error(err: ErrorDetails) -> InitErrorDetails:
    init: InitErrorDetails = {"type": err["type"], "loc": err["loc"], "input": err["input"]}
    if "ctx" in err:
        init["ctx"] = err["ctx"]
    return init


# --- loading ----------------------------------------------------------------------------


class RegionFileError(ValueError):
    """One or more region files are invalid; one line per problem, all problems listed.

    Each line reads ``<file>: <field path>: <reason>`` (or ``<file>:<line>: ...`` for a
    TOML syntax error).
    """

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__("\n".join(self.problems))

    def __reduce__(self) -> tuple[type[RegionFileError], tuple[tuple[str, ...]]]:
        # Rebuild from the problem list, not from the joined message.
        return (type(self), (self.problems,))


def load_region(path: Path) -> Region:
    """Load and validate one region file; RegionFileError lists every problem in it."""
    region, problems = _read_region(path, expect_id_from_stem=False)
    if region is None or problems:
        raise RegionFileError(problems)
    return region


def load_regions(directory: Path) -> dict[str, Region]:
    """Load every ``*.toml`` in ``directory``, keyed by region id.

    Each file must be named after its region id (``r1.toml`` holds region ``r1``). One
    RegionFileError lists the problems of all files.
    """
    paths = sorted(directory.glob("*.toml"))
    if not paths:
        raise RegionFileError([f"{directory}: no *.toml region files found"])
    regions: dict[str, Region] = {}
    problems: list[str] = []
    for path in paths:
        region, file_problems = _read_region(path, expect_id_from_stem=True)
        problems.extend(file_problems)
        if region is not None and not file_problems:
            regions[region.id] = region
    if problems:
        raise RegionFileError(problems)
    return regions


_TOML_POSITION = re.compile(r"^(?P<msg>.*) \(at line (?P<line>\d+), column (?P<col>\d+)\)$")


def _read_region(path: Path, *, expect_id_from_stem: bool) -> tuple[Region | None, list[str]]:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"{path}: cannot read: {exc}"]
    except tomllib.TOMLDecodeError as exc:
        # tomllib only puts the position in the message (before Python 3.14).
        match = _TOML_POSITION.match(str(exc))
        if match:
            msg, line, col = match["msg"], match["line"], match["col"]
            return None, [f"{path}:{line}: TOML syntax error: {msg} (column {col})"]
        return None, [f"{path}: TOML syntax error: {exc}"]

    problems = [
        f"{path}: {key}: unknown top-level key (a region file holds one [region] table)"
        for key in doc
        if key != "region"
    ]
    body = doc.get("region")
    if not isinstance(body, dict):
        problems.append(f"{path}: region: missing [region] table")
        return None, problems

    region_id = body.get("id")
    if expect_id_from_stem and isinstance(region_id, str) and region_id != path.stem:
        problems.append(
            f"{path}: region.id: region id {region_id!r} does not match the file name; "
            f"the file must be named {region_id}.toml"
        )
    try:
        region = Region.model_validate(body)
    except ValidationError as exc:
        problems.extend(
            f"{path}: {_field_path(('region', *err['loc']))}: {_reason(err)}"
            for err in exc.errors()
        )
        return None, problems
    return region, problems


def _field_path(loc: tuple[str | int, ...]) -> str:
    """('region', 'pools', 12, 'vcpu') -> 'region.pools[12].vcpu'."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
    return path


def _reason(err: ErrorDetails) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    if kind == "region_consistency":
        return err["msg"]  # already names the offending value
    reason = err["msg"].removeprefix("Value error, ")
    value = err["input"]
    if isinstance(value, bool | int | float | str):
        reason += f" (got {value!r})"
    return reason
