"""A contract's checkpoint credentials (its RGW user's keys, bucket and prefix) kept in
OpenBao, where the contract's workloads read them with a policy that reads that one secret
and nothing else. `sco checkpoints provision --openbao-region R` puts them there; how a
tenant's job logs in to get a token with the policy (AppRole, JWT from the scheduler) is
the site's, as for every OpenBao secret.

    KV v2  sco/<region>/checkpoints/<contract>   access_key, secret_key, endpoint, bucket, prefix
    ACL    sco-<region>-checkpoints-<contract>   read that path only
"""

from __future__ import annotations

from dataclasses import dataclass

from activities.checkpoints.rgw import Credentials
from workers.openbao.client import BaoClient
from workers.openbao.plan import KV_MOUNT


@dataclass(frozen=True)
class StoredSecret:
    contract: str
    path: str  # the KV v2 data path a workload reads (GET /v1/<path>)
    policy: str
    changed: bool  # False: OpenBao held exactly these already (no new secret version)


def data_path(region: str, contract: str) -> str:
    return f"{KV_MOUNT}/data/{region}/checkpoints/{contract}"


def policy_name(region: str, contract: str) -> str:
    return f"sco-{region}-checkpoints-{contract}"


def policy_hcl(region: str, contract: str) -> str:
    return f'path "{data_path(region, contract)}" {{\n  capabilities = ["read"]\n}}\n'


def secret_of(creds: Credentials) -> dict[str, str]:
    return {
        "access_key": creds.access_key,
        "secret_key": creds.secret_key,
        "endpoint": creds.endpoint,
        "bucket": creds.bucket,
        "prefix": creds.prefix,
    }


def store(client: BaoClient, region: str, creds: Credentials) -> StoredSecret:
    """Write the contract's secret and its read policy; idempotent (an equal secret is not
    written again, so its version history shows only real changes)."""
    path, policy = data_path(region, creds.contract), policy_name(region, creds.contract)
    wanted = secret_of(creds)
    held = client.read(path)
    changed = (held or {}).get("data") != wanted
    if changed:
        client.write(path, {"data": wanted})
    hcl = policy_hcl(region, creds.contract)
    if client.policy(policy) != hcl:
        client.write(f"sys/policies/acl/{policy}", {"policy": hcl})
        changed = True
    return StoredSecret(creds.contract, path, policy, changed)
