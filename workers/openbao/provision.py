"""Bring an OpenBao server to a `Plan`, changing only what differs; issue certificates.

Idempotent: every step reads first and writes only a difference, so a second run reports
no change and creates no new KV version, key or CA. Restart-safe: a run stopped half-way
is finished by the next (an intermediate CA whose signing did not finish is made again).
What exists but is not SCO's shape (a mount of another type at our path) is an error, never
replaced.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nacl.signing import SigningKey

from contracts.keys import key_id
from workers.openbao.client import BaoClient, BaoError, BaoRequestError
from workers.openbao.plan import (
    INTERMEDIATE_TTL,
    KV_MOUNT,
    LEAF_MAX_TTL_S,
    ROOT_MOUNT,
    ROOT_TTL,
    Plan,
    check_kind,
    check_name,
    pki_mount,
    role_name,
    spiffe_id,
)


class ProvisionError(BaoError):
    """The server holds something SCO's plan cannot be laid over; one line naming it."""


@dataclass(frozen=True)
class Change:
    what: str  # "mount", "root-ca", "intermediate", "role", "policy", "secret", "relay-key"
    path: str

    def __str__(self) -> str:
        return f"{self.what} {self.path}"


def provision(
    client: BaoClient, plan: Plan, *, new_seed: Callable[[], bytes] = lambda: os.urandom(32)
) -> list[Change]:
    """Apply `plan`; the changes made, in order ([] when the server already matched)."""
    changes: list[Change] = []
    existing = client.mounts()
    for m in plan.mounts:
        have = existing.get(f"{m.path}/")
        if have is not None:
            if have.get("type") != m.type:
                raise ProvisionError(
                    f"mount {m.path}/: is a {have.get('type')} engine, SCO needs {m.type}"
                )
            continue
        body: dict[str, Any] = {"type": m.type, "options": m.options}
        if m.max_lease_ttl:
            body["config"] = {"max_lease_ttl": m.max_lease_ttl}
        client.write(f"sys/mounts/{m.path}", body)
        changes.append(Change("mount", m.path))

    if not client.list_keys(f"{ROOT_MOUNT}/issuers"):
        client.write(
            f"{ROOT_MOUNT}/root/generate/internal",
            {
                "common_name": "SCO root CA",
                "issuer_name": "sco-root",
                "key_type": "ec",
                "key_bits": 384,
                "ttl": ROOT_TTL,
            },
        )
        changes.append(Change("root-ca", ROOT_MOUNT))

    for inter in plan.intermediates:
        if client.list_keys(f"{inter.mount}/issuers"):
            continue
        csr = client.write(
            f"{inter.mount}/intermediate/generate/internal",
            {"common_name": inter.common_name, "key_type": "ec", "key_bits": 256},
        )["csr"]
        signed = client.write(
            f"{ROOT_MOUNT}/root/sign-intermediate",
            {
                "csr": csr,
                "common_name": inter.common_name,
                "ttl": INTERMEDIATE_TTL,
                "use_csr_values": False,
            },
        )
        chain = "\n".join([signed["certificate"], signed["issuing_ca"]])
        client.write(f"{inter.mount}/intermediate/set-signed", {"certificate": chain})
        changes.append(Change("intermediate", inter.mount))

    for role in plan.roles:
        want = role.body()
        have = client.read(role.path)
        if have is None or any(_differs(have.get(k), v) for k, v in want.items()):
            client.write(role.path, want)
            changes.append(Change("role", role.path))

    for policy in plan.policies:
        if client.policy(policy.name) != policy.hcl:
            client.write(f"sys/policies/acl/{policy.name}", {"policy": policy.hcl})
            changes.append(Change("policy", policy.name))

    for secret in plan.secrets:
        have = client.read(f"{KV_MOUNT}/data/{secret.path}")
        if have is None or have.get("data") != secret.data:
            client.write(f"{KV_MOUNT}/data/{secret.path}", {"data": secret.data})
            changes.append(Change("secret", f"{KV_MOUNT}/{secret.path}"))

    for key in plan.relay_keys:
        path = f"{KV_MOUNT}/data/{key.path}"
        if client.read(path) is not None:
            continue
        signing = SigningKey(new_seed())
        data = {
            "seed": bytes(signing).hex(),
            "public_key": bytes(signing.verify_key).hex(),
            "key_id": key_id(signing.verify_key),
        }
        try:
            # cas=0: create only; a key another run wrote meanwhile is kept.
            client.write(path, {"options": {"cas": 0}, "data": data})
        except BaoRequestError as exc:
            if exc.status == 400 and any("check-and-set" in e for e in exc.errors):
                continue
            raise
        changes.append(Change("relay-key", f"{KV_MOUNT}/{key.path}"))
    return changes


def _differs(have: Any, want: Any) -> bool:
    if isinstance(want, list):
        return sorted(map(str, have or [])) != sorted(map(str, want))
    return bool(have != want)


@dataclass(frozen=True)
class Issued:
    spiffe_id: str
    certificate: str  # PEM, the leaf
    private_key: str  # PEM
    ca_chain: str  # PEM, the region's intermediate then the root
    serial: str
    expires_at: int  # Unix seconds


def issue(
    client: BaoClient,
    region: str,
    kind: str,
    *,
    instance: str | None = None,
    ttl_s: int | None = None,
) -> Issued:
    """A certificate and key from the kind's role (a hall's relay: its hall's), with the
    SPIFFE ID as its only SAN. `instance` is a hall for a relay, a node for an agent;
    other kinds' roles refuse one."""
    check_name("region", region)
    check_kind(kind)
    if ttl_s is not None and not 60 <= ttl_s <= LEAF_MAX_TTL_S:
        raise ProvisionError(f"ttl {ttl_s} s: must be 60 to {LEAF_MAX_TTL_S} s")
    uri = spiffe_id(region, kind, instance)
    body: dict[str, Any] = {"uri_sans": uri, "exclude_cn_from_sans": True, "format": "pem"}
    if ttl_s is not None:
        body["ttl"] = f"{ttl_s}s"
    data = client.write(f"{pki_mount(region)}/issue/{role_name(kind, instance)}", body)
    chain = data.get("ca_chain") or [data.get("issuing_ca", "")]
    return Issued(
        spiffe_id=uri,
        certificate=str(data["certificate"]),
        private_key=str(data["private_key"]),
        ca_chain="\n".join(str(c) for c in chain) + "\n",
        serial=str(data.get("serial_number", "")),
        expires_at=int(data.get("expiration", 0)),
    )


def sign(
    client: BaoClient,
    region: str,
    kind: str,
    csr_pem: str,
    *,
    instance: str | None = None,
    ttl_s: int | None = None,
) -> Issued:
    """A certificate for the caller's own key (`csr_pem`, asking for the kind's SPIFFE ID:
    the role refuses any other URI) from the kind's role: a renewal that keeps its key, so a
    reader of the certificate and key files never pairs a new key with an old
    certificate. `private_key` is empty: the caller holds it."""
    check_name("region", region)
    check_kind(kind)
    if ttl_s is not None and not 60 <= ttl_s <= LEAF_MAX_TTL_S:
        raise ProvisionError(f"ttl {ttl_s} s: must be 60 to {LEAF_MAX_TTL_S} s")
    uri = spiffe_id(region, kind, instance)
    body: dict[str, Any] = {
        "csr": csr_pem,
        "uri_sans": uri,
        "exclude_cn_from_sans": True,
        "use_csr_common_name": False,
        "format": "pem",
    }
    if ttl_s is not None:
        body["ttl"] = f"{ttl_s}s"
    data = client.write(f"{pki_mount(region)}/sign/{role_name(kind, instance)}", body)
    chain = data.get("ca_chain") or [data.get("issuing_ca", "")]
    return Issued(
        spiffe_id=uri,
        certificate=str(data["certificate"]),
        private_key="",
        ca_chain="\n".join(str(c) for c in chain) + "\n",
        serial=str(data.get("serial_number", "")),
        expires_at=int(data.get("expiration", 0)),
    )
