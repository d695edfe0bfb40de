"""Contract benchmark: compile and sign 1,000 contracts; verify a bundle as a node does.

    .venv/bin/python bench/contracts_bench.py [--contracts 1000] [--verify-runs 200] [--tiny]

Prints one JSON report (bench/report.py); no target is stated for these figures.
The contracts are variations of the shipped examples, each with its own
namespace and Slurm tag so that no two selectors overlap.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import Report
from contracts import bundle, keys
from contracts.cache import BundleCache
from contracts.compiler import compile_and_sign

EXAMPLES = ROOT / "contracts" / "examples"


def write_contracts(src: Path, n: int) -> None:
    bases = [yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES.glob("*.yaml"))]
    for i in range(n):
        doc = dict(bases[i % len(bases)])
        doc["name"] = f"{doc['name']}-{i:04d}"
        doc.pop("floor", None)  # 1,000 floors would not fit committed capacity
        doc["tier"] = max(2, doc["tier"])
        sel = {
            "kubernetes": [{"namespace": f"ns-{i:04d}"}],
            "slurm": [{"account": f"acct{i:04d}", "partition": "spot"}],
        }
        doc["selectors"] = sel
        (src / f"c{i:04d}.yaml").write_text(yaml.safe_dump(doc))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contracts", type=int, default=1000)
    ap.add_argument("--verify-runs", type=int, default=200)
    ap.add_argument("--tiny", action="store_true", help="20 contracts, 10 verifications")
    args = ap.parse_args()
    if args.tiny:
        args.contracts, args.verify_runs = 20, 10
    report = Report("contracts", {"contracts": args.contracts, "verify_runs": args.verify_runs})
    tmp = Path(tempfile.mkdtemp(prefix="sco-contracts-bench-"))
    src = tmp / "src"
    src.mkdir()
    write_contracts(src, args.contracts)
    _, private, _ = keys.generate(tmp / "keys")
    key = keys.load_signing_key(private)
    out = tmp / "bundle.json"

    started = time.perf_counter()
    result, serial = compile_and_sign(
        src, ROOT / "deploy" / "regions", key, out, serial=1, created_at=datetime.now(UTC)
    )
    compile_s = time.perf_counter() - started
    anchor = f"{args.contracts} contract files, all 3 region files"
    if serial != 1:
        errors = [str(f) for f in result.findings if f.severity == "error"][:3]
        report.measurement_missing(
            "compile_and_sign", f"the bundle did not compile: {errors}", "s", anchor=anchor
        )
        return report.emit()
    report.figure("compile_and_sign", compile_s, "s", anchor=anchor)

    trust = keys.TrustStore.load(tmp / "keys")
    raw = out.read_bytes()
    verify_ms = []
    for _ in range(args.verify_runs):
        t = time.perf_counter()
        bundle.verify(raw, trust)
        verify_ms.append((time.perf_counter() - t) * 1000)
    cache = BundleCache(tmp / "cache", trust)
    t = time.perf_counter()
    accepted = cache.offer(raw).accepted
    offer_ms = (time.perf_counter() - t) * 1000
    vanchor = f"a {len(raw)} B bundle of {args.contracts} contracts, as a node checks it"
    report.figure("verify_p50", statistics.median(verify_ms), "ms", anchor=vanchor)
    report.figure("verify_max", max(verify_ms), "ms", anchor=vanchor)
    if accepted:
        report.figure("node_cache_offer", offer_ms, "ms", anchor=vanchor + ", first offer")
    else:
        report.measurement_missing(
            "node_cache_offer", "the node cache refused the bundle", "ms", anchor=vanchor
        )
    report.details.update({"bundle_bytes": len(raw), "warnings": len(result.findings)})
    return report.emit()


if __name__ == "__main__":
    raise SystemExit(main())
