"""Where each NATS identity reads its replies (workers/nats_permissions.py grants them).

Apart from the permissions so that every process's connect (`nats_options`) reads the
prefix without loading what the rendered users need (the bundle's and the holders'
modules, and with them the contract models: ~3 MB a process).
"""

from __future__ import annotations

#: Every identity but an agent gets replies under `_INBOX_SCO.<user>` (nats_options adds
#: it for a `nats_url` that names a user): no agent's `_INBOX_<node>` can start with it, and
#: no identity may subscribe to another's or to `_INBOX.>`.
IDENTITY_INBOX_ROOT = "_INBOX_SCO"


def identity_inbox(user: str) -> str:
    """The inbox prefix of a control-plane identity (a process or the CLI)."""
    return f"{IDENTITY_INBOX_ROOT}.{user}"


def agent_inbox(node: str) -> str:
    """The agent's inbox prefix (agent/natslink.py uses the same): replies and JetStream
    deliveries to one node land where no other node may subscribe."""
    return f"_INBOX_{node}"
