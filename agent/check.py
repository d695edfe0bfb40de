"""`sco-agent --check`: is this node ready to drain? Config, trust, bundle, tools."""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agent.clock import kernel_sync
from agent.config import AgentConfig, ConfigError, load_config
from agent.firstbundle import fetch_first_sync
from agent.pinned import load_pinned
from contracts.cache import BundleCache
from contracts.keys import KeyFileError, TrustStore
from contracts.node_bundle import NodeVerifiedBundle
from contracts.notice_signing import notice_trust


@dataclass(frozen=True)
class Line:
    ok: bool
    what: str
    detail: str
    #: Not a failure, but the node drains conservatively until it is resolved.
    waiting: bool = False

    def render(self) -> str:
        status = "WAIT" if self.waiting else "ok" if self.ok else "FAIL"
        return f"[{status}] {self.what}: {self.detail}"


def summary(ok: bool, lines: list[Line]) -> str:
    if not ok:
        return "NOT ready: fix the FAIL lines above"
    if any(line.waiting for line in lines):
        return "ready to drain conservatively (requeue every workload) until a bundle arrives"
    return "ready to drain"


def run_check(path: Path | None, env: dict[str, str] | None = None) -> tuple[bool, list[Line]]:
    lines: list[Line] = []
    try:
        config = load_config(path, env)
    except ConfigError as exc:
        return False, [Line(False, "config", str(exc))]
    lines.append(
        Line(
            True,
            "config",
            f"{path or '(env only)'}: node {config.node_id} in {config.region}/{config.hall}, "
            f"scheduler {config.scheduler}{', dry-run' if config.dry_run else ''}",
        )
    )
    lines.extend(_bundle(config))
    lines.extend(_clock(config))
    lines.extend(_tools(config))
    lines.append(_sockets(config))
    return all(line.ok for line in lines), lines


def _bundle(config: AgentConfig) -> list[Line]:
    try:
        trust = TrustStore.load(config.trust_dir)
    except KeyFileError as exc:
        return [Line(False, "trust", str(exc))]
    if not trust.keys:
        return [Line(False, "trust", f"{config.trust_dir}: no .pub keys")]
    out = [Line(True, "trust", f"{len(trust.keys)} key(s), {len(trust.revoked)} revoked")]
    cache = BundleCache(config.cache_dir, trust)
    bundle = cache.current()
    if bundle is None:
        damaged = cache.path.exists()
        # A fresh node (or a damaged file): fetch from the distributor now, so the agent
        # starts with a bundle; the agent would fetch it too, this makes the start certain.
        fetched = fetch_first_sync(cache, config)
        bundle = cache.current() if fetched.serial is not None else None
        if bundle is None:
            if damaged:
                why = f"{cache.path} does not verify (see log above) and {fetched.detail}"
                out.append(Line(False, "bundle", f"{why}: drains would requeue everything"))
            elif not config.nats_urls:
                out.append(
                    Line(
                        False,
                        "bundle",
                        f"{cache.path} missing and {fetched.detail}: install one "
                        "(`sco contracts install`) or set nats_urls",
                    )
                )
            else:
                out.append(
                    Line(
                        True,
                        "bundle",
                        f"none yet (fresh node: {fetched.detail}): the agent starts, drains "
                        "conservatively (requeue every workload) and fetches one every "
                        f"{config.bundle_first_retry_seconds:g} s until it has one",
                        waiting=True,
                    )
                )
            out.append(_notice_keys(config, None))
            return out
        out.append(Line(True, "distributor", fetched.detail))
    age = bundle.age(datetime.now(UTC))
    names = ", ".join(c.name for c in bundle.content.contracts)
    stale = " (STALE: still used for drains)" if bundle.stale else ""
    out.append(
        Line(True, "bundle", f"serial {bundle.serial}, age {age}, contracts: {names}{stale}")
    )
    out.append(_notice_keys(config, bundle))
    return out


def _notice_keys(config: AgentConfig, bundle: NodeVerifiedBundle | None) -> Line:
    """Can this node verify a genuine notice: the bundle's keys (while young enough) and
    the keys pinned in the install."""
    pinned, _, problem = load_pinned(config)
    too_old = bundle is not None and bundle.age(datetime.now(UTC)) > timedelta(
        hours=config.bundle_max_age_hours
    )
    content = bundle.content if bundle is not None and not too_old else None
    trust = notice_trust(content, pinned, config.region)
    lead = trust.lead
    now = datetime.now(UTC)
    # Keys that verify this node's hall now (a hall-scoped bundle: its hall's, unretired).
    keys = [k for k in trust.keys if trust.scope_refusal(k, config.hall, now) is None]
    in_bundle = content.notice_policy(config.region) if content is not None else None
    where = (
        f"{len(in_bundle.keys) if in_bundle else 0} in the bundle"
        + (f" (too old for notices: over {config.bundle_max_age_hours:g} h)" if too_old else "")
        + f", {len(pinned.keys) if pinned else 0} pinned in the install"
        + (f" ({problem})" if problem else "")
    )
    if trust.hall_scoped:
        where += f"; hall-scoped: {len(keys)} sign for hall {config.hall}"
    if not keys and bundle is None:
        return Line(
            True,
            "notice keys",
            f"none for {config.region} until the first bundle ({where}): relay notices are "
            "refused until then; set notice_keys_dir to the relays' public keys",
            waiting=True,
        )
    if not keys:
        return Line(
            False,
            "notice keys",
            f"none for {config.region}/{config.hall} ({where}): every relay notice would be "
            "refused; "
            + (
                f"publish a bundle with a key for hall {config.hall} (`sco keys relay-new`)"
                if trust.hall_scoped
                else "set notice_keys_dir to the relays' public keys"
            ),
        )
    return Line(True, "notice keys", f"{len(keys)} key(s): {where}; lead {lead} s")


def _clock(config: AgentConfig) -> list[Line]:
    kernel = kernel_sync()
    if kernel is None:
        state = "kernel sync state unknown"
    elif kernel.synchronised:
        state = f"NTP synchronised (max error {kernel.max_error_seconds:g} s)"
    else:
        state = "the kernel does not report NTP sync"
    if config.require_time_sync and not (kernel is not None and kernel.synchronised):
        return [
            Line(
                True,
                "clock",
                f"{state}: require_time_sync: the agent starts only if its offset against "
                f"NATS is within {config.notice_deadline_margin_seconds:g} s",
                waiting=True,
            )
        ]
    return [Line(True, "clock", state)]


def _tools(config: AgentConfig) -> list[Line]:
    if config.scheduler != "slurm":
        return []
    missing = [t for t in ("scontrol", "squeue") if shutil.which(t) is None]
    if missing:
        return [Line(False, "slurm", f"{', '.join(missing)} not on PATH")]
    return [Line(True, "slurm", "scontrol and squeue found")]


def _has_cap_chown() -> bool:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    effective = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("CapEff:")), "0")
    return bool(int(effective, 16) & 1)  # bit 0: CAP_CHOWN


def _sockets(config: AgentConfig) -> Line:
    """The checkpoint socket dir (agent/checkpoint/jobdirs.py): the agent's own, writable
    by nobody else, and the agent able to hand each job its directory."""
    where = config.socket_dir
    try:
        st = where.lstat()
    except FileNotFoundError:
        return Line(True, "checkpoint sockets", f"{where} not there yet (the unit makes it)")
    except OSError as exc:
        return Line(False, "checkpoint sockets", f"{where}: {exc}")
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return Line(
            False,
            "checkpoint sockets",
            f"{where} must be a directory of the agent's user that no one else can write "
            f"(mode {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid}): tenants could take "
            "each other's socket names",
        )
    if config.scheduler != "none" and os.geteuid() != 0 and not _has_cap_chown():
        return Line(
            False,
            "checkpoint sockets",
            "no CAP_CHOWN: the agent cannot hand jobs their checkpoint directories, so "
            "checkpoint and decommission contracts would be forced (the unit grants it)",
        )
    return Line(True, "checkpoint sockets", f"{where}: mode {stat.S_IMODE(st.st_mode):04o}")
