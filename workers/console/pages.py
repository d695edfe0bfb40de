"""The operator console's pages (`sco console`): each a data function (JSON-able dict) and
an HTML rendering of the same dict, so the page and its `?format=json` never disagree.

Read-only: every number comes from the same readers as `sco estate status`
(workers/estate_view.py), fleet state and the ledger. Approving stays an operator action
through `sco acquisitions approve` or Temporal.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from workers.estate_view import read_estate
from workers.settings import Settings

Page = Callable[[Settings, dict[str, str]], dict[str, Any]]

_NAV = [
    ("/", "Estate"),
    ("/pools", "Pool heat map"),
    ("/acquisitions", "Acquisitions"),
    ("/spend", "Spend and lost work"),
]
_STYLE = """
body{font-family:sans-serif;margin:1.5em;color:#222}
nav a{margin-right:1em} table{border-collapse:collapse;margin:0.6em 0 1.2em}
td,th{border:1px solid #bbb;padding:3px 8px;text-align:right;font-size:13px}
th{background:#eee} td.l,th.l{text-align:left} .down{background:#f6c6c6}
.degraded{background:#f9d9a8} .heat0{background:#fff} .heat1{background:#fde2c8}
.heat2{background:#fbb77a} .heat3{background:#f47c3c;color:#fff} .excl{outline:2px solid #900}
small{color:#666}
"""


def _window(params: dict[str, str]) -> tuple[str, datetime, datetime]:
    text = params.get("window", "24h")
    units = {"m": 60, "h": 3600, "d": 86400}
    try:
        seconds = float(text[:-1]) * units[text[-1]]
    except (KeyError, ValueError, IndexError):
        text, seconds = "24h", 86400.0
    end = datetime.now(UTC)
    return text, end - timedelta(seconds=seconds), end


def estate_page(s: Settings, _params: dict[str, str]) -> dict[str, Any]:
    """Regions x halls: exactly `sco estate status --json`."""
    return read_estate(s).model_dump(mode="json")


def acquisitions_page(s: Settings, _params: dict[str, str]) -> dict[str, Any]:
    """Open acquisitions per region with progress and their Temporal UI page."""
    from activities.fleet.control_state import ControlRepository
    from activities.fleet.db import open_pool
    from workers.cli.common import workflow_url
    from workers.estate_view import region_settings

    regions: list[dict[str, Any]] = []
    for r in s.regions:
        rs = region_settings(s, r)
        try:
            pool = open_pool(rs.postgres_dsn, min_size=1, max_size=1)
            try:
                rows = ControlRepository(pool).open_acquisitions(r)
            finally:
                pool.close()
        except Exception as exc:  # one region's fleet state down: shown, the rest listed
            regions.append({"region": r, "answered": False, "error": str(exc).splitlines()[0]})
            continue
        regions.append(
            {
                "region": r,
                "answered": True,
                "acquisitions": [
                    {
                        "acquisition_id": a.acquisition_id,
                        "workload": a.workload,
                        "state": a.state,
                        "requested_instances": a.requested_instances,
                        "launched": a.launched,
                        "active": a.active,
                        "failed": a.failed,
                        "shortfall_units": a.shortfall_units,
                        "pools": a.pool_ids,
                        "created_at": a.created_at.isoformat(timespec="seconds"),
                        "temporal_ui": workflow_url(rs, r, a.acquisition_id),
                    }
                    for a in rows
                ],
            }
        )
    waiting = [
        {**a, "region": g["region"]}
        for g in regions
        for a in g.get("acquisitions", [])
        if a["state"] == "waiting_approval"
    ]
    return {"regions": regions, "approvals_waiting": waiting}


def pools_page(s: Settings, params: dict[str, str]) -> dict[str, Any]:
    """Reclaims per pool over the window (the ledger) and the pools excluded now."""
    from activities.ledger.queries import reclaims_per_pool
    from activities.ledger.store import LedgerStore
    from workers.client_security import ledger_options

    window, start, end = _window(params)
    estate = read_estate(s)
    excluded = {p for r in estate.regions for h in r.halls for p in h.excluded_pools if r.answered}
    error = ""
    reclaims: dict[str, int] = {}
    try:
        store = LedgerStore(s.effective_ledger_dsn, client_options=ledger_options(s))
        try:
            for row in reclaims_per_pool(store, start=start, end=end):
                reclaims[row.pool_id] = row.reclaims
        finally:
            store.close()
    except Exception as exc:  # the ledger down: exclusions still show
        error = f"ledger: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    pools = sorted(set(reclaims) | excluded)
    return {
        "window": window,
        "ledger_error": error,
        "pools": [
            {"pool_id": p, "reclaims": reclaims.get(p, 0), "excluded": p in excluded} for p in pools
        ],
    }


def spend_page(s: Settings, params: dict[str, str]) -> dict[str, Any]:
    """Spend and lost work per team (the contract's owner) over the window."""
    from activities.ledger.lost_work import lost_work
    from activities.ledger.queries import spend
    from activities.ledger.store import LedgerStore
    from contracts.bundle import installed_bundle
    from workers.client_security import ledger_options

    window, start, end = _window(params)
    bundle, _why = installed_bundle(s.bundle_cache_dir, s.trust_dir)
    owner = {c.name: c.owner for c in bundle.content.contracts} if bundle is not None else {}
    teams: dict[str, dict[str, Any]] = {}

    def team(workload: str) -> dict[str, Any]:
        name = owner.get(workload, workload)
        return teams.setdefault(
            name,
            {
                "team": name,
                "workloads": [],
                "spend": 0.0,
                "lost_steps": 0,
                "lost_seconds": 0.0,
                "drains": 0,
            },
        )

    error = ""
    try:
        store = LedgerStore(s.effective_ledger_dsn, client_options=ledger_options(s))
        try:
            for row in spend(store, start=start, end=end, group_by=("workload",)):
                t = team(row.workload or "")
                t["spend"] = round(t["spend"] + row.spend, 4)
                t["workloads"] = sorted({*t["workloads"], row.workload or ""})
            for lw in lost_work(store, start=start, end=end, by="workload"):
                t = team(lw.key)
                t["lost_steps"] += lw.lost_steps
                t["lost_seconds"] = round(t["lost_seconds"] + lw.lost_seconds, 3)
                t["drains"] += lw.drains
                t["workloads"] = sorted({*t["workloads"], lw.key})
        finally:
            store.close()
    except Exception as exc:  # the ledger down: said on the page
        error = f"ledger: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return {
        "window": window,
        "ledger_error": error,
        "teams": sorted(teams.values(), key=lambda t: -t["spend"]),
    }


PAGES: dict[str, tuple[str, Page]] = {
    "/": ("Estate", estate_page),
    "/pools": ("Pool heat map", pools_page),
    "/acquisitions": ("Acquisitions", acquisitions_page),
    "/spend": ("Spend and lost work", spend_page),
}


# --- HTML -------------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape(str(value))


def _cell(region: str, hall: str, field: str, value: object, cls: str = "") -> str:
    klass = f' class="{cls}"' if cls else ""
    return (
        f'<td{klass} data-region="{_e(region)}" data-hall="{_e(hall)}" '
        f'data-field="{_e(field)}">{_e(value)}</td>'
    )


def render(path: str, data: dict[str, Any], s: Settings) -> str:
    title = PAGES[path][0]
    body = {
        "/": _estate_html,
        "/pools": _pools_html,
        "/acquisitions": _acq_html,
        "/spend": _spend_html,
    }[path](data, s)
    nav = " ".join(f'<a href="{p}">{_e(t)}</a>' for p, t in _NAV)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>SCO console: {_e(title)}</title><style>{_STYLE}</style></head><body>"
        f"<nav>{nav} <small>read-only; <a href='{path}?format=json'>this page as JSON</a>"
        f"</small></nav><h1>{_e(title)}</h1>{body}</body></html>"
    )


def _estate_html(data: dict[str, Any], _s: Settings) -> str:
    cols = [
        ("floor", "floor held/target"),
        ("reclaimable_instances", "reclaimable"),
        ("committed_instances", "committed"),
        ("excluded_pools", "excluded pools"),
        ("open_acquisitions", "open acquisitions"),
        ("approvals_waiting", "approvals waiting"),
        ("spend_per_hour", "spend/h"),
    ]
    head = "".join(f"<th>{_e(c[1])}</th>" for c in cols)
    rows = []
    for r in data["regions"]:
        if not r["answered"]:
            rows.append(
                f'<tr class="down" data-region="{_e(r["region"])}" data-answered="false">'
                f'<td class="l">{_e(r["region"])}</td>'
                f'<td class="l" colspan="{len(cols) + 1}">not answering: {_e(r["error"])}</td></tr>'
            )
            continue
        for h in r["halls"]:
            reg, hall = r["region"], h["hall"]
            floor = (
                f'<td data-region="{_e(reg)}" data-hall="{_e(hall)}" '
                f'data-field="floor" data-held="{h["floor_held_units"]}" '
                f'data-target="{h["floor_target_units"]}">'
                f"{h['floor_held_units']}/{h['floor_target_units']}</td>"
            )
            cells = [
                floor,
                _cell(reg, hall, "reclaimable_instances", h["reclaimable_instances"]),
                _cell(reg, hall, "committed_instances", h["committed_instances"]),
                _cell(reg, hall, "excluded_pools", len(h["excluded_pools"])),
                _cell(reg, hall, "open_acquisitions", h["open_acquisitions"]),
                _cell(reg, hall, "approvals_waiting", h["approvals_waiting"]),
                _cell(reg, hall, "spend_per_hour", f"{h['spend_per_hour']:.2f}"),
            ]
            rows.append(
                f'<tr data-region="{_e(reg)}" data-answered="true"><td class="l">{_e(reg)}</td>'
                f'<td class="l">{_e(hall)}</td>{"".join(cells)}</tr>'
            )
    floors = []
    for r in data["regions"]:
        for f in r.get("floors", []):
            cls = "degraded" if f["state"] != "holding" else ""
            floors.append(
                f'<tr class="{cls}"><td class="l">{_e(r["region"])}</td>'
                f'<td class="l">{_e(f["contract"])}</td><td class="l">{_e(f["state"])}</td>'
                f"<td>{f['held_units']}/{f['floor_units']}</td>"
                f'<td class="l">{_e(", ".join(f["lost_halls"]) or "-")}</td></tr>'
            )
    partial = "".join(
        f"<p class='degraded' data-partial='{_e(r['region'])}'>{_e(r['region'])}: partial "
        f"({_e('; '.join(r['partial']))}): floors not shown</p>"
        for r in data["regions"]
        if r["answered"] and r["partial"]
    )
    return (
        f"{partial}<p><small>generated {_e(data['generated_at'])}, each region within "
        f"{data['deadline_seconds']:g} s</small></p>"
        f'<table id="estate"><tr><th class="l">region</th><th class="l">hall</th>{head}</tr>'
        + "".join(rows)
        + "</table><h2>Floors</h2><table><tr><th class='l'>region</th><th class='l'>contract</th>"
        "<th class='l'>state</th><th>held/floor</th><th class='l'>lost halls</th></tr>"
        + "".join(floors)
        + "</table>"
    )


def _pools_html(data: dict[str, Any], _s: Settings) -> str:
    from contracts.pool_id import PoolId

    grid: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    shapes: set[str] = set()
    for p in data["pools"]:
        pid = PoolId.parse(p["pool_id"])
        shape = f"{pid.sku}.{pid.size}"
        shapes.add(shape)
        grid.setdefault((pid.region, pid.hall), {})[shape] = p
    cols = sorted(shapes)
    rows = []
    for (region, hall), cells in sorted(grid.items()):
        tds = []
        for c in cols:
            p = cells.get(c)
            if p is None:
                tds.append("<td></td>")
                continue
            level = min(3, (p["reclaims"] + 1) // 2) if p["reclaims"] else 0
            cls = f"heat{level}" + (" excl" if p["excluded"] else "")
            mark = " ✕" if p["excluded"] else ""
            tds.append(
                f'<td class="{cls}" data-pool="{_e(p["pool_id"])}" title="{_e(p["pool_id"])}">'
                f"{p['reclaims']}{mark}</td>"
            )
        rows.append(
            f'<tr><td class="l">{_e(region)}</td><td class="l">{_e(hall)}</td>{"".join(tds)}</tr>'
        )
    err = f"<p class='down'>{_e(data['ledger_error'])}</p>" if data["ledger_error"] else ""
    if not rows:
        return f"{err}<p>No reclaims in the last {_e(data['window'])} and no pool excluded.</p>"
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    return (
        f"{err}<p><small>reclaim notices per pool in the last {_e(data['window'])}; "
        "✕ excluded now</small></p>"
        f'<table id="pools"><tr><th class="l">region</th><th class="l">hall</th>{head}</tr>'
        + "".join(rows)
        + "</table>"
    )


def _acq_html(data: dict[str, Any], _s: Settings) -> str:
    def row(a: dict[str, Any], region: str) -> str:
        return (
            f'<tr data-acquisition="{_e(a["acquisition_id"])}"><td class="l">{_e(region)}</td>'
            f'<td class="l"><a href="{_e(a["temporal_ui"])}">{_e(a["acquisition_id"])}</a></td>'
            f'<td class="l">{_e(a["workload"])}</td><td class="l">{_e(a["state"])}</td>'
            f"<td>{a['active']}/{a['requested_instances']}</td><td>{a['launched']}</td>"
            f"<td>{a['failed']}</td><td>{a['shortfall_units']}</td></tr>"
        )

    head = (
        "<tr><th class='l'>region</th><th class='l'>acquisition (Temporal UI)</th>"
        "<th class='l'>contract</th><th class='l'>state</th><th>active/requested</th>"
        "<th>launched</th><th>failed</th><th>short units</th></tr>"
    )
    rows = []
    for g in data["regions"]:
        if not g["answered"]:
            rows.append(
                f"<tr class='down'><td class='l'>{_e(g['region'])}</td>"
                f"<td class='l' colspan='7'>not answering: {_e(g['error'])}</td></tr>"
            )
            continue
        rows += [row(a, g["region"]) for a in g["acquisitions"]]
    waiting = [row(a, a["region"]) for a in data["approvals_waiting"]]
    return (
        f'<table id="acquisitions">{head}{"".join(rows)}</table>'
        "<h2>Approvals waiting</h2><p><small>approve with <code>sco acquisitions approve "
        "ID --by you --reason why</code> (a signed-in operator action)</small></p>"
        f'<table id="approvals">{head}{"".join(waiting)}</table>'
    )


def _spend_html(data: dict[str, Any], _s: Settings) -> str:
    err = f"<p class='down'>{_e(data['ledger_error'])}</p>" if data["ledger_error"] else ""
    rows = "".join(
        f'<tr data-team="{_e(t["team"])}"><td class="l">{_e(t["team"])}</td>'
        f'<td class="l">{_e(", ".join(t["workloads"]))}</td><td>{t["spend"]:.2f}</td>'
        f"<td>{t['drains']}</td><td>{t['lost_steps']}</td><td>{t['lost_seconds']:.0f}</td></tr>"
        for t in data["teams"]
    )
    return (
        f"{err}<p><small>the last {_e(data['window'])} (?window=7d)</small></p>"
        "<table id='spend'><tr><th class='l'>team</th><th class='l'>contracts</th>"
        "<th>spend</th><th>drains</th><th>lost steps</th><th>lost seconds</th></tr>"
        f"{rows}</table>"
    )
