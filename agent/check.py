"""`sco-agent --check`: is this node ready to drain? Config, trust, bundle, tools."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from agent.config import AgentConfig, ConfigError, load_config
from agent.firstbundle import fetch_first_sync
from contracts.cache import BundleCache
from contracts.keys import KeyFileError, TrustStore


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
    lines.extend(_tools(config))
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
            return out
        out.append(Line(True, "distributor", fetched.detail))
    age = bundle.age(datetime.now(UTC))
    names = ", ".join(c.name for c in bundle.content.contracts)
    stale = " (STALE: still used for drains)" if bundle.stale else ""
    out.append(
        Line(True, "bundle", f"serial {bundle.serial}, age {age}, contracts: {names}{stale}")
    )
    policy = bundle.content.notice_policy(config.region)
    if policy is None or not policy.keys:
        out.append(
            Line(
                False,
                "notice keys",
                f"the bundle lists none for {config.region}: every relay notice would be refused",
            )
        )
    else:
        out.append(
            Line(True, "notice keys", f"{len(policy.keys)} key(s), lead {policy.lead_seconds} s")
        )
    return out


def _tools(config: AgentConfig) -> list[Line]:
    if config.scheduler != "slurm":
        return []
    missing = [t for t in ("scontrol", "squeue") if shutil.which(t) is None]
    if missing:
        return [Line(False, "slurm", f"{', '.join(missing)} not on PATH")]
    return [Line(True, "slurm", "scontrol and squeue found")]
