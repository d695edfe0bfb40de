"""`sco contracts compile`: validate, check feasibility, sign. Nothing is written on error."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from nacl.encoding import HexEncoder
from nacl.signing import SigningKey

from contracts import bundle
from contracts.atomic import write_atomic
from contracts.bounded import MAX_BUNDLE_BYTES, loads
from contracts.feasibility import check_all
from contracts.findings import Finding, Severity, errors
from contracts.keys import KeyFileError, TrustStore
from contracts.model import Contract
from contracts.notice import NoticePolicy
from contracts.notice_scopes import SCOPES_FILE, read_scopes
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
        raw = previous_bundle.read_bytes()
        doc = loads(raw, what=str(previous_bundle), max_bytes=MAX_BUNDLE_BYTES)
        return int(doc["content"]["serial"]) + 1
    except (OSError, ValueError, KeyError, TypeError):
        return 1


def notice_policies(
    keys_dir: Path, regions: dict[str, Region], now: datetime | None = None
) -> tuple[list[NoticePolicy], list[Finding]]:
    """`<keys_dir>/<region>/<key id>.pub`: the keys that may sign that region's notices
    (ids in its `revoked.txt` left out), with the region's notice lead; with
    `<keys_dir>/<region>/scopes.yaml` (contracts/notice_scopes.py) the halls each signs
    for. A key retired by `now` (its `not_after` passed) is left out of the bundle."""
    if not keys_dir.is_dir():
        return [], [Finding(str(keys_dir), 1, "(notice keys)", "directory does not exist")]
    policies, findings = [], []
    for sub in sorted(p for p in keys_dir.iterdir() if p.is_dir()):
        region = regions.get(sub.name)
        if region is None:
            findings.append(Finding(str(sub), 1, "(notice keys)", "no such region"))
            continue
        try:
            trust = TrustStore.load(sub)
        except KeyFileError as exc:
            findings.append(Finding(str(sub), 1, "(notice keys)", str(exc)))
            continue
        keys = {
            kid: vk.encode(HexEncoder).decode()
            for kid, vk in trust.keys.items()
            if kid not in trust.revoked
        }
        scopes, found = read_scopes(sub, region, set(keys))
        findings += found
        if scopes is not None and now is not None:
            for kid, scope in list(scopes.items()):
                if scope.not_after is not None and scope.not_after <= now:
                    del scopes[kid], keys[kid]
                    findings.append(
                        Finding(
                            str(sub / SCOPES_FILE),
                            1,
                            kid,
                            f"retired at {scope.not_after.isoformat()}: left out of the "
                            "bundle (remove its .pub and entry when convenient)",
                            Severity.WARNING,
                        )
                    )
        if scopes is not None and not scopes and keys:
            # A policy without scopes reads as region-wide: refuse rather than widen.
            findings.append(
                Finding(
                    str(sub / SCOPES_FILE),
                    1,
                    "(document)",
                    "names no live key of the directory: every key would sign for no hall "
                    f"(give one halls: `sco keys relay-new --region {region.id} --hall H`)",
                )
            )
            continue
        if keys:
            policies.append(
                NoticePolicy(
                    region=region.id,
                    lead_seconds=region.notice_lead_seconds,
                    keys=keys,
                    scopes=scopes or {},
                )
            )
    return policies, findings


def _regions_without_notice_keys(
    contracts: list[Contract], regions: dict[str, Region], policies: list[NoticePolicy]
) -> list[Finding]:
    covered = sorted({r for c in contracts for r in c.regions})
    keyed = {p.region for p in policies if p.keys}
    return [
        Finding(
            "(notice keys)",
            1,
            region,
            f"region {region} has notice relays but the bundle would carry no notice keys "
            f"for it (nodes would refuse its genuine notices): pass --notice-keys DIR with "
            f"DIR/{region}/<key id>.pub",
        )
        for region in covered
        if region in regions and regions[region].halls and region not in keyed
    ] + [
        Finding(
            "(notice keys)",
            1,
            f"{p.region}/{hall}",
            f"region {p.region} scopes its notice keys to halls and none signs for hall "
            f"{hall} (its nodes would refuse its relay's genuine notices): "
            f"`sco keys relay-new --region {p.region} --hall {hall}`",
        )
        for p in policies
        if p.region in covered and p.region in regions and p.hall_scoped
        for hall in regions[p.region].halls
        if not any(hall in scope.halls for scope in p.scopes.values())
    ]


def compile_and_sign(
    src_dir: Path,
    regions_dir: Path,
    key: SigningKey,
    out: Path,
    *,
    serial: int | None,
    created_at: datetime,
    notice_keys_dir: Path | None = None,
    source: bundle.BundleSource | None = None,
    require_notice_keys: bool = False,
) -> tuple[CompileResult, int | None]:
    """Compile; on success write the signed bundle atomically and return its serial.
    `require_notice_keys` (what `sco contracts compile` does unless told otherwise): refuse
    a bundle without notice keys for a region it covers that has notice relays (every
    region with halls: one relay per hall), whose nodes would refuse its genuine notices."""
    regions, findings = load_region_dir(regions_dir)
    if findings:
        return CompileResult([], findings), None
    policies: list[NoticePolicy] = []
    key_findings: list[Finding] = []
    if notice_keys_dir is not None:
        policies, key_findings = notice_policies(notice_keys_dir, regions, created_at)
        if errors(key_findings):
            return CompileResult([], key_findings), None
    result = compile_dir(src_dir, regions)
    result.findings = sorted([*key_findings, *result.findings])
    if not result.ok:
        return result, None
    if require_notice_keys:
        missing = _regions_without_notice_keys(result.contracts, regions, policies)
        if missing:
            return CompileResult(result.contracts, [*result.findings, *missing]), None
    serial = serial if serial is not None else next_serial(out)
    raw = bundle.build(
        result.contracts,
        serial=serial,
        created_at=created_at,
        key=key,
        notice_policies=policies,
        source=source,
    )
    write_atomic(out, raw)
    return result, serial
