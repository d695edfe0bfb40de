"""NATS users per role for one region, with least-privilege subject permissions.

`deploy/nats/sco-nats.conf` (TLS on every connection, JetStream) includes the `users.conf`
rendered here (`sco nats-users`). Roles, for region R:
    control-R          the control plane: the region's subjects and JetStream
    operator-R         `sco reclaim`: publishes reclaim requests, nothing else
    relay-R-<hall>     a hall's notice relay: publishes notices for its hall only, hears
                       its hall's reclaim requests, answers them, calls the simulated cloud
    agent-R-<node>     a node's agent: its own notice subject and durable consumer, its own
                       drain reports, the region's bundle object store (read only), the serial it
                       holds (its own key of the holders bucket)
Reclaim requests are authenticated by these transport permissions: only control-R and
operator-R may publish on `sco.R.reclaim.>`, so the relay acts only on what the server
let through from an authenticated identity.

Each user's password is read from `<secrets>/<user>.password` (made, random and 0600, when
missing); the node gets its own file as the agent's `nats_password_file`.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.distribution import bucket_for
from contracts.holders import holder_subject
from contracts.notice import (
    NOTICE_HOOKS_CONSUMER,
    notice_stream,
    notice_subject,
    reclaim_subject,
)
from workers.nats_inboxes import IDENTITY_INBOX_ROOT, agent_inbox, identity_inbox


@dataclass(frozen=True)
class User:
    name: str
    publish: list[str]
    subscribe: list[str]
    allow_responses: bool = False

    def permissions(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "publish": {"allow": self.publish},
            "subscribe": {"allow": self.subscribe},
        }
        if self.allow_responses:
            out["allow_responses"] = True
        return out

    def as_config(self, password: str) -> dict[str, Any]:
        return {"user": self.name, "password": password, "permissions": self.permissions()}

    def as_mapped_config(self, identity: str) -> dict[str, Any]:
        """The user a client certificate maps to (nats-server `verify_and_map`): named by
        the certificate's identity (a SPIFFE ID), with this role's permissions, no password."""
        return {"user": identity, "permissions": self.permissions()}


def agent_user(region: str, hall: str, node: str) -> User:
    if agent_inbox(node) == IDENTITY_INBOX_ROOT:
        raise ValueError(f"node {node!r}: its inbox would be the control plane's")
    stream, durable = notice_stream(region), f"sco-agent-{node}"
    subject = notice_subject(region, hall, node)
    objects = f"OBJ_{bucket_for(region)}"
    return User(
        f"agent-{region}-{node}",
        publish=[
            f"sco.{region}.drain.{hall}.{node}",
            f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
            # The filter is part of the create subject: no other node's notices.
            f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.{subject}",
            f"$JS.ACK.{stream}.{durable}.>",
            f"$JS.API.STREAM.INFO.{objects}",
            "$JS.API.STREAM.NAMES",  # the object store looks its stream up by subject
            f"$JS.API.DIRECT.GET.{objects}.>",
            f"$JS.API.STREAM.MSG.GET.{objects}",
            # Ephemeral consumers only (the server names them and drops them once idle):
            # no named or durable one, and no deleting anyone's (the stream also caps how
            # many consumers it holds: contracts.distribution).
            f"$JS.API.CONSUMER.CREATE.{objects}",
            f"$JS.FC.{objects}.>",
            # The serial it holds, under its own key (`sco contracts status`).
            holder_subject(region, "agent", node),
        ],
        subscribe=[subject, f"{agent_inbox(node)}.>"],
    )


def relay_user(region: str, hall: str) -> User:
    stream, name = notice_stream(region), f"relay-{region}-{hall}"
    return User(
        name,
        publish=[
            f"sco.{region}.notice.{hall}.>",
            f"$JS.API.STREAM.INFO.{stream}",
            f"$JS.API.STREAM.CREATE.{stream}",
            # The region worker's backlog of notices to tell Temporal of (its answer).
            f"$JS.API.CONSUMER.INFO.{stream}.{NOTICE_HOOKS_CONSUMER}",
            f"sco.{region}.sim.>",  # the simulated cloud's API (the region in a box)
        ],
        subscribe=[reclaim_subject(region, hall), f"{identity_inbox(name)}.>"],
        allow_responses=True,  # answers `sco reclaim` on its reply subject
    )


def operator_user(region: str) -> User:
    name = f"operator-{region}"
    return User(name, publish=[f"sco.{region}.reclaim.>"], subscribe=[f"{identity_inbox(name)}.>"])


def control_user(region: str) -> User:
    name = f"control-{region}"
    everything = [f"sco.{region}.>", "$JS.>", "$O.>", "$KV.>"]
    return User(
        name,
        # It answers requests (the simulated cloud) on the requester's inbox.
        publish=[*everything, "_INBOX.>", f"{IDENTITY_INBOX_ROOT}.>"],
        subscribe=[*everything, f"{identity_inbox(name)}.>"],
    )


def region_users(region: str, halls: Sequence[str], nodes: Sequence[tuple[str, str]]) -> list[User]:
    """Every identity of the region; `nodes` are (hall, node) pairs."""
    return [
        control_user(region),
        operator_user(region),
        *(relay_user(region, h) for h in halls),
        *(agent_user(region, h, n) for h, n in nodes),
    ]


def password(secrets_dir: Path, user: str) -> str:
    path = secrets_dir / f"{user}.password"
    if not path.exists():
        secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(24) + "\n")
    return path.read_text().strip()


def render_users(users: Sequence[User], secrets_dir: Path) -> str:
    """The `authorization` block nats-server reads (its config syntax accepts JSON values)."""
    entries = [json.dumps(u.as_config(password(secrets_dir, u.name))) for u in users]
    body = ",\n    ".join(entries)
    return (
        "# Rendered by `sco nats-users`: one user per SCO role (workers/nats_permissions.py).\n"
        "# Holds passwords: keep it 0600, like the secrets directory it was made from.\n"
        f"authorization {{\n  users: [\n    {body}\n  ]\n}}\n"
    )


def write_users(path: Path, users: Sequence[User], secrets_dir: Path) -> None:
    text = render_users(users, secrets_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
