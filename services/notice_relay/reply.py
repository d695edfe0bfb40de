"""The notice relay's answer to a reclaim request (`sco reclaim`, the lifecycle workflow's
drain), as JSON on the request's NATS reply subject. The model lives beside the request in
contracts/notice.py, so activities read it too; it is named here for the relay and the CLI."""

from __future__ import annotations

from contracts.notice import ReclaimReply as ReclaimReply

__all__ = ["ReclaimReply"]
