"""Checkpoint client: how a workload hears the node agent's drain and answers it.

A workload registers a callback; this library listens on a Unix socket for the agent.

    from agent.checkpoint import register

    def checkpoint_now(reason: str, deadline: float) -> str:
        path = save_everything()      # must finish before `deadline` (Unix seconds)
        return path                   # where the checkpoint went

    server = register(checkpoint_now)  # returns at once; a daemon thread serves

Socket: `$SCO_CHECKPOINT_SOCKET` if set, else `<dir>/<name>/sock` where dir is
`$SCO_CHECKPOINT_SOCKET_DIR` (default /run/sco-agent/checkpoint) and name is
`slurm_<$SLURM_JOB_ID>`, or `pod_<$POD_NAMESPACE>_<$POD_NAME>` (downward API), else
`pid_<pid>`, each part escaped so no two jobs share a name (`agent.checkpoint.naming`).
The agent finds a job's socket by the same name.

Who may talk to whom (`agent.checkpoint.jobdirs`, `agent.checkpoint.peer`): the job's
directory is made by the agent for the job's user (mode 0770, group sco-agent) in a socket
dir no tenant can write; a workload started first waits for it (`server.listening`). The
agent talks to the socket only when the directory, the socket and the listening process
(SO_PEERCRED uid, gid, and the pod's cgroup) are the job's as its scheduler names it; the
workload answers only the agent (root, its own user, or the socket dir's owner). Each
connection has its own thread and deadline; a reply that is not protocol v1 (too long, too
deep, a count outside 0..10**9) is no answer, and the job is forced.

Protocol v1: one JSON object per line, one request and one reply per connection, the
agent connects:

    agent    -> {"v": 1, "op": "checkpoint", "reason": "...", "deadline": 1767225600.0,
                 "notice_id": "..."}
    workload <- {"v": 1, "ok": true, "path": "s3://.../step-1200"}
             or {"v": 1, "ok": false, "error": "why not"}

Ops: `checkpoint` (save state now, the agent then requeues the job), `decommission`
(Spark: leave gracefully — migrate shuffle/cached blocks and exit; the agent waits for the
job to end, see `agent.checkpoint.spark`), `early_checkpoint` (an early warning: run the
checkpoint callback and keep running; the hard notice follows), `ping` (liveness,
answers ok with path "").
`deadline` is Unix seconds: the agent stops waiting at that time and forces the job off
the node (requeue or kill). A request with another `v` is answered
{"v": 1, "ok": false, "error": "unsupported protocol version ..."}; a later version adds
fields, never changes these. Unknown request fields are ignored.
"""

from __future__ import annotations

from agent.checkpoint.client import send_request
from agent.checkpoint.protocol import VERSION, ProtocolError, Reply, Request
from agent.checkpoint.server import Callback, CheckpointServer, default_socket_path, register

__all__ = [
    "VERSION",
    "Callback",
    "CheckpointServer",
    "ProtocolError",
    "Reply",
    "Request",
    "default_socket_path",
    "register",
    "send_request",
]
