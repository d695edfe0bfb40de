"""What each command prints with `--json`: one schema per command, in one place.

docs/reference.md shows it under each command (`sco docs reference`), and a test checks
that every command with a `--json` option is listed here, so a new one cannot ship
without saying what it prints. A schema is an object or a list of objects with the fields
of a model (pydantic or a dataclass, imported only when the reference is rendered) and
any fields the command adds.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class JsonOutput:
    shape: Literal["object", "list"]
    model: str | None = None  # "package.module:Class": its fields come first
    extra: tuple[str, ...] = ()  # fields the command adds (or all of them, without a model)
    drop: tuple[str, ...] = ()  # model fields the command leaves out

    def fields(self) -> list[str]:
        names: list[str] = []
        if self.model is not None:
            module, attr = self.model.split(":")
            cls = getattr(importlib.import_module(module), attr)
            if dataclasses.is_dataclass(cls):
                names = [f.name for f in dataclasses.fields(cls)]
            else:
                names = list(cls.model_fields)
        return [n for n in names if n not in self.drop] + [n for n in self.extra if n not in names]

    def describe(self) -> str:
        fields = ", ".join(f"`{f}`" for f in self.fields())
        what = "an object" if self.shape == "object" else "a list of objects"
        return f"`--json` prints {what} with {fields}."


_ACK = ("acquisition_id", "region")
_LINKS = ("workflow_id", "ui_url")
_HALL = ("region", "hall", "event", "told", "worker_running")

SCHEMAS: dict[str, JsonOutput] = {
    "sco acquisitions approve": JsonOutput(
        "object", "workflows.acquisition.models:ControlAck", (*_ACK, "ui_url")
    ),
    "sco acquisitions cancel": JsonOutput(
        "object", "workflows.acquisition.models:ControlAck", (*_ACK, "ui_url")
    ),
    "sco acquisitions list": JsonOutput(
        "list",
        extra=(
            "id",
            "contract",
            "state",
            "units_requested",
            "units_acquired",
            "requested",
            "acquired",
            "halls",
            "pools",
            "status",
            "started",
            "ui_url",
        ),
    ),
    "sco acquisitions pause": JsonOutput(
        "object", "workflows.acquisition.models:ControlAck", (*_ACK, "ui_url")
    ),
    "sco acquisitions resume": JsonOutput(
        "object", "workflows.acquisition.models:ControlAck", (*_ACK, "ui_url")
    ),
    "sco acquisitions show": JsonOutput(
        "object", "workflows.acquisition.models:AcquisitionProgress", ("ui_url",)
    ),
    "sco budget set-rate": JsonOutput(
        "object", extra=("region", "rate_per_second", "burst", "applied", "ui_url")
    ),
    "sco budget status": JsonOutput("object", "activities.budget:BudgetStatus", ("ui_url",)),
    "sco checkpoints list": JsonOutput(
        "list", extra=("run", "step", "state", "objects", "bytes", "last_modified")
    ),
    "sco checkpoints provision": JsonOutput(
        "list", extra=("contract", "user", "bucket", "prefix", "credentials")
    ),
    "sco controller start": JsonOutput("list", extra=_LINKS),
    "sco controller status": JsonOutput(
        "list", "workflows.controller.models:ControllerStatus", ("ui_url",)
    ),
    "sco contracts compile": JsonOutput(
        "object", extra=("bundle", "serial", "contracts", "key_id", "warnings")
    ),
    "sco contracts install": JsonOutput(
        "object", extra=("serial", "changed", "reason", "cache_dir")
    ),
    "sco contracts keygen": JsonOutput("object", extra=("key_id", "private", "public")),
    "sco contracts pull": JsonOutput("object", extra=("serial", "changed", "reason")),
    "sco contracts render-admission": JsonOutput("object", extra=("serial", "written")),
    "sco contracts publish": JsonOutput("list", extra=("region", "serial", "object", "bytes")),
    "sco contracts reset-serial": JsonOutput(
        "object", extra=("region", "to_serial", "key_id", "out", "object")
    ),
    "sco contracts status": JsonOutput(
        "object",
        extra=(
            "region",
            "published_serial",
            "published",
            "published_commit",
            "published_signer",
            "consumers",
        ),
    ),
    "sco contracts verify": JsonOutput(
        "object", extra=("serial", "contracts", "key_id", "created_at", "stale")
    ),
    "sco db migrate": JsonOutput("object", extra=("applied", "version")),
    "sco demand collect": JsonOutput("object", extra=("workflow_id", "worker_running", "ui_url")),
    "sco demand intake": JsonOutput("object", "workflows.intake.models:IntakeStatus", ("ui_url",)),
    "sco demand list": JsonOutput(
        "list",
        "activities.fleet.control_state:DemandRow",
        ("headroom_units", "headroom_why"),
    ),
    "sco demand set": JsonOutput(
        "object",
        extra=(
            "contract",
            "region",
            "source",
            "units",
            "changed",
            "controller",
            "signalled",
            "ui_url",
        ),
    ),
    "sco demand sources": JsonOutput("object", "activities.demand.intake:CollectResult"),
    "sco dev bao issue": JsonOutput("object", extra=("spiffe_id", "serial", "expires_at", "files")),
    "sco dev bao provision": JsonOutput("object", extra=("changes",)),
    "sco dev bao status": JsonOutput(
        "object", extra=("address", "initialized", "sealed", "version")
    ),
    "sco dev certs list": JsonOutput("object", extra=("nodes", "revoked")),
    "sco dev certs node": JsonOutput(
        "object",
        extra=("identity", "nats_tls_cert", "nats_tls_key", "nats_tls_ca", "nats_url"),
    ),
    "sco dev down": JsonOutput("object", extra=("stopped",)),
    "sco dev up": JsonOutput("list", "workers.devbox.box:ServiceStatus"),
    "sco dev status": JsonOutput("list", "workers.devbox.box:ServiceStatus"),
    "sco dev memory-diff": JsonOutput("object", extra=("before_kb", "after_kb", "grown")),
    "sco explain contract": JsonOutput(
        "object", "activities.explain:ContractExplanation", ("notes",)
    ),
    "sco explain instance": JsonOutput(
        "object", "activities.explain:InstanceExplanation", ("notes",)
    ),
    "sco explain pool": JsonOutput("object", "activities.explain:PoolExplanation", ("notes",)),
    "sco floor reset": JsonOutput(
        "object",
        extra=("workflow_id", "reset_to_event", "why", "new_run_id", "dry_run", "ui_url"),
    ),
    "sco floor start": JsonOutput("list", extra=_LINKS),
    "sco estate status": JsonOutput("object", "workers.estate_view:EstateView"),
    "sco floor status": JsonOutput("list", "workflows.floor.models:FloorStatus", ("ui_url",)),
    "sco hall lost": JsonOutput("object", extra=_HALL),
    "sco hall restored": JsonOutput("object", extra=_HALL),
    "sco instances list": JsonOutput(
        "list", "activities.fleet.repository:InstanceRow", ("drifted", "drift_reason")
    ),
    "sco keys relay-list": JsonOutput("object", extra=("region", "keys", "problems")),
    "sco keys relay-new": JsonOutput(
        "object", extra=("key_id", "region", "hall", "private", "public", "still_signing")
    ),
    "sco keys relay-retire": JsonOutput("object", extra=("key_id", "region", "not_after")),
    "sco ledger decisions": JsonOutput("list", "activities.decisions:Decision"),
    "sco ledger record-drains": JsonOutput("object", extra=("drains", "workload_outcomes")),
    "sco ledger lost-work": JsonOutput("list", "activities.ledger.lost_work:LostWorkRow"),
    "sco ledger reclaims": JsonOutput("list", "activities.ledger.queries:ReclaimRow"),
    "sco ledger spend": JsonOutput("list", "activities.ledger.queries:SpendRow"),
    "sco nats-users": JsonOutput("object", extra=("region", "users_conf", "users", "secrets")),
    "sco outbox dead-letters": JsonOutput(
        "list", "activities.fleet.dead_letters:DeadLetter", ("value_bytes",), drop=("value",)
    ),
    "sco outbox retry": JsonOutput("object", extra=("id", "requeued_outbox_id", "produced_to")),
    "sco outbox status": JsonOutput("object", extra=("waiting", "oldest_seconds")),
    "sco lifecycle pause": JsonOutput(
        "object", extra=("region", "contract", "event", *_LINKS, "worker_running")
    ),
    "sco lifecycle resume": JsonOutput(
        "object", extra=("region", "contract", "event", *_LINKS, "worker_running")
    ),
    "sco lifecycle start": JsonOutput("list", extra=_LINKS),
    "sco lifecycle status": JsonOutput(
        "object", "workflows.lifecycle.models:LifecycleStatus", ("ui_url",)
    ),
    "sco pool exclude": JsonOutput(
        "object", "workflows.exclusion.models:ExclusionAck", ("pool_id", "region", "ui_url")
    ),
    "sco pool list": JsonOutput("list", "activities.exclusion.models:ExclusionRow"),
    "sco pool readmit": JsonOutput(
        "object", "workflows.exclusion.models:ExclusionAck", ("pool_id", "region", "ui_url")
    ),
    "sco pool status": JsonOutput(
        "object", "workflows.exclusion.models:ExclusionStatus", ("ui_url",)
    ),
    "sco pools list": JsonOutput("list", "activities.fleet.repository:PoolRow"),
    "sco pools sync": JsonOutput("object", "activities.fleet.activities:SyncPoolsOutput"),
    "sco reclaim": JsonOutput(
        "object",
        "contracts.reclaim:ReclaimReply",
        ("region", "hall", "pool_id", "summary", "exclusion_ui_url"),
    ),
    "sco reconcile": JsonOutput(
        "object", "workflows.reconciler.models:ReconcileReport", ("ui_url",)
    ),
    "sco temporal bootstrap": JsonOutput(
        "list", extra=("namespace", "namespace_state", "search_attributes_added")
    ),
    "sco sim lifecycle": JsonOutput("object", "estate.lifecycle_eval:LifecycleResult"),
    "sco slurm nodes": JsonOutput("list", "activities.fleet.repository:InstanceRow"),
    "sco slurm resume": JsonOutput("object", "workers.slurm_power_programs:Report"),
    "sco slurm resume-failed": JsonOutput("object", "workers.slurm_power_programs:Report"),
    "sco slurm suspend": JsonOutput("object", "workers.slurm_power_programs:Report"),
}
