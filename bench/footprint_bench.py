"""The control plane's footprint at the estate's scale and at 10x, beside the seed's budget.

    .venv/bin/python bench/footprint_bench.py [--saturation FILE] [--controller-tick FILE]
        [--memory FILE] [--estate FILE] [--report bench/results/latest.json] [--tiny]

A model, not a measurement: the per-unit costs measured by the other benches times the
work of the estate simulator's month (3 regions, 432 pools: `sco sim estate --policy
sco`), plus each process's memory times how many of it the estate runs. Inputs, each
from the named file or else from the report's last run of that bench (--report):
- CPU-ms per acquisition and per notice, of the region worker and of Temporal's server
  (bench/saturation_bench.py: the `_alone` rows, else the ramp's mixed per-acquisition
  row with the notices' share in it);
- CPU-ms per controller tick at 10,000 units, the worker's and the server's
  (bench/controller_tick_bench.py);
- each process's VmRSS (bench/memory_hour_bench.py's end of run, else
  bench/process_rss_bench.py's start floor);
- the month's acquisitions, notices (reclaims) and instances (the estate simulator).
Every assumption (the ticks, the peak factor, what production runs in place of a box's
stand-in, the seed's budget) is in details.assumptions and in docs/footprint.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import Report

MONTH_S = 30 * 86400
REGIONS = 3
HALLS_PER_REGION = 4
#: Defaults of workers/settings.py: controller partitions per region, seconds per tick.
PARTITIONS = 4
TICK_S = 60.0
#: The estate simulator's month (sco policy, seed 1, 2 tenants, 30 days), recorded in
#: bench/results/runs/2026-12-06-estate_month_sco.json; --estate reads another.
ESTATE_RECORD = ROOT / "bench" / "results" / "runs" / "2026-12-06-estate_month_sco.json"
#: The seed (view 25): per region 3 controller pods at 2 vCPU, 3 PostgreSQL nodes at
#: 8 vCPU, scorer and watcher at 4 vCPU each; ~145 vCPU across 3 regions with shares of
#: Kafka, ClickHouse, Prometheus and the agents.
SEED = {"controller_pods": 3 * 2, "postgres_nodes": 3 * 8, "scorer": 4, "watcher": 4}
SEED_TOTAL_VCPU = 145.0
#: Peak over the month's mean: a hall lost at once re-acquires its share within minutes.
PEAK_FACTOR = 10.0
#: The seed's PostgreSQL (Patroni, 3 nodes at 8 vCPU) is kept as the seed sized it: SCO's
#: fleet state load on it was 1.5-2.6 % of a core at 480 acquisitions/min (saturation).
POSTGRES_VCPU_PER_REGION = SEED["postgres_nodes"]


RUNS = ROOT / "bench" / "results" / "runs"


def bench_of(
    path: Path | None, report: dict[str, Any] | None, name: str, needs: tuple[str, ...]
) -> dict[str, Any]:
    """The named file; else the report's last run of bench `name`, else the newest run
    of it recorded under bench/results/runs/ (file names start with the date): the
    first of those with a figure of `needs`."""
    if path is not None:
        out: dict[str, Any] = json.loads(path.read_text())
        return out
    candidates = [dict(b) for b in (report or {}).get("benches", []) if b.get("bench") == name]
    for file in sorted(RUNS.glob("*.json"), reverse=True):
        try:
            run = json.loads(file.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(run, dict) and run.get("bench") == name:
            candidates.append({**run, "recorded_in": str(file.relative_to(ROOT))})
    for c in candidates:
        if any(f["name"] in needs and f["value"] is not None for f in c.get("figures", [])):
            return c
    return {}


def fig(bench: dict[str, Any], *names: str) -> float | None:
    values = {f["name"]: f["value"] for f in bench.get("figures", [])}
    for n in names:
        if values.get(n) is not None:
            return float(values[n])
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    ap.add_argument("--saturation", type=Path, default=None)
    ap.add_argument("--controller-tick", type=Path, default=None)
    ap.add_argument("--memory", type=Path, default=None, help="memory_hour or process_rss JSON")
    ap.add_argument("--estate", type=Path, default=ESTATE_RECORD)
    ap.add_argument("--tiny", action="store_true", help="the same model (it takes no time)")
    args = ap.parse_args()
    report = Report("footprint", {"regions": REGIONS, "partitions": PARTITIONS, "tick_s": TICK_S})
    last = json.loads(args.report.read_text()) if args.report.is_file() else None

    sat = bench_of(
        args.saturation,
        last,
        "saturation",
        ("cpu_ms_worker_per_acquisition_alone", "cpu_ms_worker_per_acquisition"),
    )
    tick = bench_of(args.controller_tick, last, "controller_tick", ("controller_tick_cpu_ms",))
    mem = bench_of(args.memory, last, "memory_hour", ("worker-r1_rss_end",)) or bench_of(
        None, last, "process_rss", ("worker_start_rss",)
    )
    estate = json.loads(args.estate.read_text())
    report.details["sources"] = {
        "saturation": sat.get("recorded_in") or sat.get("run_at") or str(args.saturation),
        "controller_tick": tick.get("recorded_in") or tick.get("run_at"),
        "memory": mem.get("recorded_in") or mem.get("run_at") or str(args.memory),
        "estate": str(args.estate),
    }
    sco = next(p for p in estate["policies"] if p["policy"] == "sco")

    cost = {
        "worker_ms_per_acquisition": fig(
            sat, "cpu_ms_worker_per_acquisition_alone", "cpu_ms_worker_per_acquisition"
        ),
        "temporal_ms_per_acquisition": fig(
            sat, "cpu_ms_temporal_per_acquisition_alone", "cpu_ms_temporal_per_acquisition"
        ),
        # Mixed rows hold a notice per two acquisitions: the notice is then inside them.
        "worker_ms_per_notice": fig(sat, "cpu_ms_worker_per_notice_alone") or 0.0,
        "temporal_ms_per_notice": fig(sat, "cpu_ms_temporal_per_notice_alone") or 0.0,
        "worker_ms_per_tick": fig(tick, "controller_tick_cpu_ms"),
        "temporal_ms_per_tick": fig(tick, "controller_tick_cpu_ms_temporal") or 0.0,
    }
    missing = [k for k, v in cost.items() if v is None]
    if missing:
        report.measurement_missing(
            "footprint_vcpu_seed_scale",
            f"no measured {', '.join(missing)} (run saturation and controller_tick first)",
            "vCPU",
            anchor="the model's inputs",
        )
        return report.emit()
    c = {k: float(v or 0.0) for k, v in cost.items()}
    days = float(estate.get("days", 30))
    scale = 30 / days
    work = {
        "acquisitions": sco.get("acquisitions", 0) * scale,
        "notices": sco["reclaims"] * scale,
        "ticks": REGIONS * PARTITIONS * MONTH_S / TICK_S,
        "instances_mean": sco["reclaimable_instance_hours"] * scale / (MONTH_S / 3600),
    }

    def vcpu(mult: float) -> dict[str, float]:
        """Mean vCPU of each part over the month at `mult` times the work (ticks plan
        `mult` times the units: the planner's cost taken as linear in them)."""
        ms = {
            "worker": work["acquisitions"] * mult * c["worker_ms_per_acquisition"]
            + work["notices"] * mult * c["worker_ms_per_notice"]
            + work["ticks"] * c["worker_ms_per_tick"] * mult,
            "temporal": work["acquisitions"] * mult * c["temporal_ms_per_acquisition"]
            + work["notices"] * mult * c["temporal_ms_per_notice"]
            + work["ticks"] * c["temporal_ms_per_tick"] * mult,
        }
        return {k: v / 1000 / MONTH_S for k, v in ms.items()}

    rss = {f["name"]: f["value"] for f in mem.get("figures", []) if f["value"] is not None}

    def mb(*names: str) -> float:
        for n in names:
            for key in (f"{n}_rss_end", f"{n}_start_rss"):
                if key in rss:
                    return float(rss[key])
        return 0.0

    worker_mb = mb("worker-r1", "worker")
    relay_mb = mb("notice-relay-r1-B", "notice_relay")
    small_mb = mb("relay-r1", "outbox_relay") + mb("drain-intake-r1", "drain_intake")
    temporal_mb = mb("temporal")
    agent_mb = mb("agent")

    def model(mult: float) -> dict[str, Any]:
        mean = vcpu(mult)
        peak = {k: v * PEAK_FACTOR for k, v in mean.items()}
        # One worker takes about one core (saturation: 72 % of a core at its knee):
        # workers per region for the peak, at least 2 for a rolling restart.
        workers = max(2, math.ceil(peak["worker"] / REGIONS / 0.7))
        # Temporal: its frontend/history/matching as the peak asks, at least 2 vCPU.
        temporal_vcpu = max(2.0, peak["temporal"] / REGIONS)
        per_region = {
            "workers_vcpu": float(workers),
            "temporal_vcpu": round(temporal_vcpu, 2),
            "relays_and_intake_vcpu": 0.5,
            "postgres_vcpu": float(POSTGRES_VCPU_PER_REGION),
        }
        memory_mb = REGIONS * (
            workers * worker_mb + HALLS_PER_REGION * relay_mb + small_mb + temporal_mb
        )
        agents_mb = work["instances_mean"] * mult * agent_mb
        return {
            "mean_vcpu": {k: round(v, 4) for k, v in mean.items()},
            "peak_vcpu": {k: round(v, 3) for k, v in peak.items()},
            "workers_per_region": workers,
            "per_region_vcpu": per_region,
            "control_plane_vcpu": round(REGIONS * sum(per_region.values()), 1),
            "control_plane_memory_gb": round(memory_mb / 1024, 2),
            "agents_memory_gb": round(agents_mb / 1024, 1),
            "agents": round(work["instances_mean"] * mult),
        }

    seed, ten = model(1.0), model(10.0)
    report.details.update(
        {
            "inputs_ms": c,
            "work_per_month": {k: round(v, 1) for k, v in work.items()},
            "memory_mb": {
                "worker": worker_mb,
                "notice_relay": relay_mb,
                "outbox_relay_and_drain_intake": small_mb,
                "temporal_dev_server": temporal_mb,
                "agent": agent_mb,
            },
            "seed_scale": seed,
            "ten_x": ten,
            "seed_budget_vcpu": {"per_region": SEED, "total": SEED_TOTAL_VCPU},
            "assumptions": [
                f"work: the estate simulator's month (sco policy, {estate.get('regions')}, "
                f"{estate.get('pools')} pools, {days:g} days scaled to 30): a tenant's "
                "launches in one minute are one acquisition; a reclaim is one notice",
                f"ticks: {PARTITIONS} controller partitions per region, one tick per "
                f"{TICK_S:g} s, each costed as the 10,000-unit tick of the controller_tick "
                "bench (an upper bound: a partition plans a quarter of the contracts)",
                "10x: ten times the acquisitions, notices and instances; a tick's planning "
                "ten times dearer (linear in units); the same regions and partitions",
                f"peak = {PEAK_FACTOR:g} x the month's mean (a hall lost re-acquires at once)",
                "a worker process serves ~0.7 vCPU of work (its saturation knee); at least "
                "2 per region for rolling restarts",
                "Temporal's cost per unit is the dev server's (SQLite) from the saturation "
                "bench: production's Temporal on PostgreSQL is taken to cost the same",
                "PostgreSQL kept at the seed's 3 x 8 vCPU per region (fleet state took "
                "<3 % of a core at 480 acquisitions/min)",
                "memory: each process's VmRSS (memory_hour end of run, else process_rss "
                "start), 4 notice relays per region (one per hall), the ledger consumer's "
                "embedded chDB left out (production uses a ClickHouse server)",
                "agents: one per instance under management (the month's mean), their CPU at "
                "rest taken as nil (they wait on NATS)",
            ],
        }
    )
    anchor = "model: per-unit CPU x the estate's month of work (details.assumptions)"
    report.figure(
        "footprint_vcpu_seed_scale",
        seed["control_plane_vcpu"],
        "vCPU",
        anchor=f"{anchor}; workers + Temporal + relays + PostgreSQL, 3 regions; the seed's "
        f"budget {SEED_TOTAL_VCPU:g} vCPU",
        target=SEED_TOTAL_VCPU,
        comparator="<=",
    )
    report.figure(
        "footprint_vcpu_10x",
        ten["control_plane_vcpu"],
        "vCPU",
        anchor=f"{anchor}; ten times the work, same regions",
    )
    report.figure(
        "footprint_mean_vcpu_seed_scale",
        sum(seed["mean_vcpu"].values()),
        "vCPU",
        anchor="the month's mean CPU of worker + Temporal at the seed's scale",
    )
    report.figure(
        "footprint_memory_gb_seed_scale",
        seed["control_plane_memory_gb"],
        "GB",
        anchor="workers, notice relays, outbox relay, drain intake, Temporal; 3 regions",
    )
    report.figure(
        "footprint_memory_gb_10x", ten["control_plane_memory_gb"], "GB", anchor="the same at 10x"
    )
    report.figure(
        "footprint_agents_memory_gb_seed_scale",
        seed["agents_memory_gb"],
        "GB",
        anchor=f"{seed['agents']} agents (instances under management, mean) x agent VmRSS",
    )
    return report.emit()


if __name__ == "__main__":
    raise SystemExit(main())
