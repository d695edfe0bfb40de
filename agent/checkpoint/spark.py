"""Spark decommission through the checkpoint socket.

Mechanism: Spark (3.1+, `spark.decommission.enabled=true`) decommissions on SIGPWR: the
signalled executor stops taking tasks, migrates its shuffle and cached RDD blocks to other
executors (`spark.storage.decommission.*`) and exits once nothing is left to move. Which
JVM to signal depends on who owns the node:

- a standalone Worker (`decommission_worker`): SIGPWR to the Worker JVM
  (`spark.worker.decommission.signal`). Signalling only the executor would not do: the
  Worker would report it exited and the Master would start a new one on the same node.
  A decommissioned Worker takes no new executors and has the Master decommission the
  ones it runs; it does not exit by itself, so once its executors have left (its
  `/json/` page lists none) it is stopped with SIGTERM and the node is free.
- an executor that is the workload itself (Kubernetes, YARN: `decommission_executor`):
  SIGPWR to the executor JVM, which exits on its own.

The callback answers once the executors have left (or at the agent's deadline), with the
tasks that will have to run again: the failed task attempts the driver's REST API
(`/api/v1/applications/<app>/allexecutors`) counts on those executors, when the driver's
UI address is known (None otherwise: the drain report then says "not known"). The agent
then waits, up to the contract's grace, for the job to leave the node, and forces it
(requeue/kill) after that.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.checkpoint.protocol import Saved
from agent.checkpoint.server import CheckpointServer, register

log = logging.getLogger(__name__)

_POLL_SECONDS = 0.5
_HTTP_TIMEOUT = 15.0  # a busy driver or Worker UI answers slowly; the deadline bounds all
# Answer this long before the agent's deadline, so the reply is in before it stops waiting.
_REPLY_MARGIN_SECONDS = 1.0

#: The driver's UI address (`http://host:4040`), or a function that finds it when asked.
DriverUi = str | Callable[[], str | None] | None


class SparkRestError(RuntimeError):
    """A Spark UI or REST endpoint did not answer as expected; the message names it."""


def get_json(url: str, timeout: float = _HTTP_TIMEOUT) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.load(response)
    except (OSError, ValueError) as exc:  # URLError is an OSError; bad JSON a ValueError
        raise SparkRestError(f"{url}: {exc}") from exc


def worker_executors(worker_ui: str, timeout: float = _HTTP_TIMEOUT) -> list[tuple[str, str]]:
    """(application id, executor id) of every executor the Worker runs now."""
    state = get_json(f"{worker_ui.rstrip('/')}/json/", timeout)
    return [(str(e["appid"]), str(e["id"])) for e in state.get("executors", [])]


def failed_tasks(driver_ui: str, executors: list[tuple[str, str]]) -> int:
    """Failed task attempts on `executors` as the driver counts them: the tasks that ran
    there and have to run again elsewhere."""
    total = 0
    for app in sorted({a for a, _ in executors}):
        ids = {e for a, e in executors if a == app}
        listed = get_json(f"{driver_ui.rstrip('/')}/api/v1/applications/{app}/allexecutors")
        total += sum(int(e.get("failedTasks", 0)) for e in listed if str(e.get("id")) in ids)
    return total


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) has left the node too.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _resolve(driver_ui: DriverUi) -> str | None:
    return driver_ui() if callable(driver_ui) else driver_ui


def _lost_tasks(driver_ui: DriverUi, executors: list[tuple[str, str]]) -> int | None:
    url = _resolve(driver_ui)
    if url is None or not executors:
        return None if url is None else 0
    try:
        return failed_tasks(url, executors)
    except SparkRestError as exc:
        log.warning("lost Spark tasks not known: %s", exc)
        return None


def decommission_worker(
    worker_pid: int,
    worker_ui: str,
    *,
    driver_ui: DriverUi = None,
    socket_path: Path | None = None,
    stop_worker: bool = True,
) -> CheckpointServer:
    """Answer `decommission` for a standalone Worker: SIGPWR to it, wait (until the
    agent's deadline) for its executors to migrate their blocks and leave, stop it."""

    def decommission(reason: str, deadline: float) -> Saved:
        executors = worker_executors(worker_ui)
        log.info("decommissioning Spark worker %d (%s): %s", worker_pid, reason, executors)
        os.kill(worker_pid, signal.SIGPWR)
        until = deadline - _REPLY_MARGIN_SECONDS
        while time.time() < until:
            try:
                # Never asked past the deadline: the answer must be in before it.
                if not worker_executors(
                    worker_ui, max(0.5, min(_HTTP_TIMEOUT, until - time.time()))
                ):
                    break
            except SparkRestError as exc:  # the Worker went away: so did its executors
                log.warning("worker UI: %s", exc)
                break
            time.sleep(_POLL_SECONDS)
        lost = _lost_tasks(driver_ui, executors)
        if stop_worker and _alive(worker_pid):
            os.kill(worker_pid, signal.SIGTERM)
        return Saved("", lost_tasks=lost)

    return register(decommission=decommission, socket_path=socket_path)


def decommission_executor(
    executor_pid: int,
    *,
    socket_path: Path | None = None,
    driver_ui: DriverUi = None,
    app_id: str | None = None,
    executor_id: str | None = None,
) -> CheckpointServer:
    """Answer `decommission` for an executor that is the workload: SIGPWR to it, wait
    (until the agent's deadline) for it to exit; its failed tasks come from the driver
    when `driver_ui`, `app_id` and `executor_id` are given."""

    def decommission(reason: str, deadline: float) -> Saved:
        os.kill(executor_pid, signal.SIGPWR)
        until = deadline - _REPLY_MARGIN_SECONDS
        while _alive(executor_pid) and time.time() < until:
            time.sleep(_POLL_SECONDS)
        executors = [(app_id, executor_id)] if app_id and executor_id else []
        lost = _lost_tasks(driver_ui, executors) if executors else None
        return Saved("", lost_tasks=lost)

    return register(decommission=decommission, socket_path=socket_path)
