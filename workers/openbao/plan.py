"""What OpenBao holds for SCO, as data: mounts, CAs, roles, policies, secrets, relay keys.

Pure: no I/O. `workers/openbao/provision.py` compares this with what a server holds and
changes only the difference, so provisioning twice changes nothing.

Layout (one OpenBao for the estate, regions apart by mount and path):
- `pki/`: the estate's root CA. `pki_<region>/`: the region's intermediate, signed by it.
- `pki_<region>/roles/<kind>`: one role per process kind; a certificate it issues carries
  only the URI SAN `spiffe://sco/<region>/<kind>`, which is what a SPIRE server would give
  the same workload; `…/notice-relay-<hall>` issues a hall's relay `…/notice-relay/<hall>`,
  and the agent's role `…/agent/<node>` too.
- `sco/` (KV v2): `<region>/<name>` for each credential the caller gives (the box: fleet-db,
  kafka, clickhouse), and `<region>/relay-keys/<hall>`.
- ACL policies `sco-<region>-<kind>` (a hall's relay: `sco-<region>-notice-relay-<hall>`):
  issue from its own role (or have it sign a CSR: a renewal keeps its key), read its own
  secrets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

#: Every process kind that gets an identity: the long-running processes of
#: services/registry.py (tests/workers/test_openbao.py keeps the two lists equal) and the
#: node agent.
PROCESS_KINDS: tuple[str, ...] = (
    "simulator",
    "worker",
    "notice-relay",
    "outbox-relay",
    "ledger-consumer",
    "drain-intake",
    "contract-sync",
    "agent",
)

#: The secrets each kind reads, under `sco/<region>/`.
KIND_SECRETS: dict[str, tuple[str, ...]] = {
    "simulator": (),
    "worker": ("fleet-db",),
    "notice-relay": ("fleet-db", "relay-keys/{hall}"),
    "outbox-relay": ("fleet-db", "kafka"),
    "ledger-consumer": ("kafka", "clickhouse"),
    "drain-intake": ("kafka",),
    "contract-sync": (),
    "agent": (),
}

#: Kinds that run one process per hall: each hall's gets a role and a policy of its own.
HALL_KINDS = ("notice-relay",)
#: Kinds whose role issues any `…/<kind>/<instance>` (a node's agent names its node).
OPEN_INSTANCE_KINDS = ("agent",)

TRUST_DOMAIN = "sco"
ROOT_MOUNT = "pki"
KV_MOUNT = "sco"
#: Certificate lifetimes: short, renewed by the holder before they end.
LEAF_TTL_S = 3600
LEAF_MAX_TTL_S = 24 * 3600
INTERMEDIATE_TTL = "43800h"  # 5 years
ROOT_TTL = "87600h"  # 10 years

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")


class PlanError(ValueError):
    """A region, kind, hall or instance name OpenBao paths cannot carry; one line."""


def check_name(what: str, value: str) -> str:
    if not _NAME.fullmatch(value):
        raise PlanError(
            f"{what} {value!r}: must be 1-63 letters, digits and '-', "
            "starting with a letter or digit"
        )
    return value


def check_kind(kind: str) -> str:
    if kind not in PROCESS_KINDS:
        raise PlanError(f"kind {kind!r}: not one of {', '.join(PROCESS_KINDS)}")
    return kind


def pki_mount(region: str) -> str:
    return f"pki_{region}"


def spiffe_id(region: str, kind: str, instance: str | None = None) -> str:
    base = f"spiffe://{TRUST_DOMAIN}/{check_name('region', region)}/{check_kind(kind)}"
    return f"{base}/{check_name('instance', instance)}" if instance else base


def policy_name(region: str, kind: str, hall: str | None = None) -> str:
    return f"sco-{region}-{kind}-{hall}" if hall else f"sco-{region}-{kind}"


@dataclass(frozen=True)
class Mount:
    path: str  # without the trailing slash
    type: str  # "pki", "kv"
    options: dict[str, str] = field(default_factory=dict)
    max_lease_ttl: str = ""


@dataclass(frozen=True)
class Intermediate:
    region: str

    @property
    def mount(self) -> str:
        return pki_mount(self.region)

    @property
    def common_name(self) -> str:
        return f"SCO {self.region} intermediate CA"


@dataclass(frozen=True)
class Role:
    """`pki_<region>/roles/<name>`: a kind's role issues its bare SPIFFE ID (the agent's also
    `…/agent/<node>`); a hall's relay has a role of its own that issues `…/notice-relay/<hall>`
    and nothing else, so one hall's relay cannot be another."""

    region: str
    kind: str
    instance: str | None = None

    @property
    def name(self) -> str:
        return role_name(self.kind, self.instance)

    @property
    def path(self) -> str:
        return f"{pki_mount(self.region)}/roles/{self.name}"

    def body(self) -> dict[str, Any]:
        """The role as OpenBao reads it back (the keys provisioning compares)."""
        own = spiffe_id(self.region, self.kind, self.instance)
        sans = [own, f"{own}/*"] if self.kind in OPEN_INSTANCE_KINDS else [own]
        return {
            "allowed_uri_sans": sans,
            "allow_any_name": False,
            "allowed_domains": [],
            "allow_ip_sans": False,
            "allow_localhost": False,
            "enforce_hostnames": True,
            "require_cn": False,
            "server_flag": True,
            "client_flag": True,
            "key_type": "ec",
            "key_bits": 256,
            "ttl": LEAF_TTL_S,
            "max_ttl": LEAF_MAX_TTL_S,
        }


@dataclass(frozen=True)
class Secret:
    """A KV v2 entry at `sco/<path>`, kept equal to `data`."""

    path: str
    data: dict[str, str]


@dataclass(frozen=True)
class RelayKey:
    """A hall's relay signing key (Ed25519): created once, never overwritten (replacing a
    key is a rotation, not provisioning)."""

    region: str
    hall: str

    @property
    def path(self) -> str:
        return f"{self.region}/relay-keys/{self.hall}"


@dataclass(frozen=True)
class Policy:
    name: str
    hcl: str


@dataclass(frozen=True)
class Plan:
    mounts: list[Mount]
    intermediates: list[Intermediate]
    roles: list[Role]
    policies: list[Policy]
    secrets: list[Secret]
    relay_keys: list[RelayKey]


def role_name(kind: str, instance: str | None = None) -> str:
    """The role that issues `kind`'s certificates: the hall's own for a hall's relay."""
    if kind in HALL_KINDS and instance is not None:
        return f"{kind}-{check_name('hall', instance)}"
    return kind


def policy_hcl(region: str, kind: str, hall: str | None = None) -> str:
    """The ACL policy of one kind (a hall's relay: one hall) in one region: issue its own
    certificates, read its own secrets, nothing else."""
    check_name("region", region)
    check_kind(kind)
    if (kind in HALL_KINDS) != (hall is not None):
        raise PlanError(f"kind {kind}: a hall is {'needed' if kind in HALL_KINDS else 'not taken'}")
    name = policy_name(region, kind, hall)
    lines = [
        f"# {name}: generated by workers/openbao/plan.py (policy_hcl); edit there.",
        f'path "{pki_mount(region)}/issue/{role_name(kind, hall)}" {{',
        '  capabilities = ["update"]',
        "}",
        # A renewal keeps the process's key: its CSR signed by the same role.
        f'path "{pki_mount(region)}/sign/{role_name(kind, hall)}" {{',
        '  capabilities = ["update"]',
        "}",
    ]
    for secret in KIND_SECRETS[kind]:
        p = secret.format(hall=hall)
        lines += [f'path "{KV_MOUNT}/data/{region}/{p}" {{', '  capabilities = ["read"]', "}"]
    return "\n".join(lines) + "\n"


def desired(
    halls: dict[str, list[str]],
    secrets: dict[str, dict[str, dict[str, str]]],
) -> Plan:
    """The plan for `halls` (region → its halls) and `secrets` (region → name → fields).

    Raises `PlanError` for a name OpenBao paths cannot carry."""
    regions = [check_name("region", r) for r in halls]
    mounts = [
        Mount(ROOT_MOUNT, "pki", max_lease_ttl=ROOT_TTL),
        *(Mount(pki_mount(r), "pki", max_lease_ttl=INTERMEDIATE_TTL) for r in regions),
        Mount(KV_MOUNT, "kv", options={"version": "2"}),
    ]
    relay_keys = [RelayKey(r, check_name("hall", h)) for r in regions for h in halls[r]]
    roles: list[Role] = []
    policies: list[Policy] = []
    for r in regions:
        for k in PROCESS_KINDS:
            roles.append(Role(r, k))
            if k in HALL_KINDS:
                roles += [Role(r, k, h) for h in halls[r]]
                policies += [Policy(policy_name(r, k, h), policy_hcl(r, k, h)) for h in halls[r]]
            else:
                policies.append(Policy(policy_name(r, k), policy_hcl(r, k)))
    return Plan(
        mounts=mounts,
        intermediates=[Intermediate(r) for r in regions],
        roles=roles,
        policies=policies,
        secrets=[
            Secret(f"{r}/{check_name('secret', name)}", dict(fields))
            for r in regions
            for name, fields in sorted(secrets.get(r, {}).items())
        ],
        relay_keys=relay_keys,
    )
