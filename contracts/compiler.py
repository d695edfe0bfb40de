"""`sco contracts compile`: validate, check feasibility, sign. Nothing is written on error."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from nacl.signing import SigningKey

from contracts import bundle
from contracts.atomic import write_atomic
from contracts.feasibility import check_all
from contracts.findings import Finding, errors
from contracts.model import Contract
from contracts.region import Region, RegionFileError, load_regions
from contracts.source import read_contracts


@dataclass
class CompileResult:
    contracts: list[Contract]
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return not errors(self.findings)


def compile_dir(src_dir: Path, regions: dict[str, Region]) -> CompileResult:
    sources, findings = read_contracts(src_dir)
    findings += check_all(sources, regions)
    return CompileResult([s.contract for s in sources], sorted(findings))


def load_region_dir(regions_dir: Path) -> tuple[dict[str, Region], list[Finding]]:
    try:
        return load_regions(regions_dir), []
    except RegionFileError as exc:
        return {}, [Finding(str(regions_dir), 1, "(regions)", p) for p in exc.problems]


def next_serial(previous_bundle: Path) -> int:
    """One more than the serial of the bundle being replaced (1 when there is none)."""
    try:
        doc = json.loads(previous_bundle.read_bytes())
        return int(doc["content"]["serial"]) + 1
    except (OSError, ValueError, KeyError, TypeError):
        return 1


def compile_and_sign(
    src_dir: Path,
    regions_dir: Path,
    key: SigningKey,
    out: Path,
    *,
    serial: int | None,
    created_at: datetime,
) -> tuple[CompileResult, int | None]:
    """Compile; on success write the signed bundle atomically and return its serial."""
    regions, findings = load_region_dir(regions_dir)
    if findings:
        return CompileResult([], findings), None
    result = compile_dir(src_dir, regions)
    if not result.ok:
        return result, None
    serial = serial if serial is not None else next_serial(out)
    raw = bundle.build(result.contracts, serial=serial, created_at=created_at, key=key)
    write_atomic(out, raw)
    return result, serial
