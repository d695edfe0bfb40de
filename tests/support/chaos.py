"""Chaos cases' counts: each case prints one JSON line of what went wrong (all zeros when
the system held up) and, when `SCO_CHAOS_REPORT` names a file, appends the line there;
`make chaos` collects the file."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psycopg

from workers.devbox import process
from workers.devbox.services import Service


def report(case: str, **counts: int) -> dict[str, int]:
    line = json.dumps({"case": case, **counts}, sort_keys=True)
    print(line)
    target = os.environ.get("SCO_CHAOS_REPORT")
    if target:
        with Path(target).open("a") as out:
            out.write(line + "\n")
    return counts


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}


class DatabaseOutage:
    """A real outage of one database on the machine's PostgreSQL: new connections are
    refused (`ALLOW_CONNECTIONS false`) and every open one is terminated, until `end()`."""

    def __init__(self, dsn: str) -> None:
        self._name = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
        self._admin = psycopg.conninfo.make_conninfo(dsn, dbname="postgres")

    def begin(self) -> None:
        with psycopg.connect(self._admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{self._name}" ALLOW_CONNECTIONS false')
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (self._name,),
            )

    def end(self) -> None:
        with psycopg.connect(self._admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{self._name}" ALLOW_CONNECTIONS true')


class KillableService:
    """A devbox service of the test's own (its port, its data directory), SIGKILLed and
    started again on the same address and data; `stop()` ends it for good."""

    def __init__(self, svc: Service) -> None:
        self._svc = svc
        self._record = svc.start()

    def kill(self) -> None:
        os.killpg(self._record.pid, signal.SIGKILL)
        process.stop(self._record)

    def start(self) -> None:
        self._record = self._svc.start()

    def stop(self) -> None:
        process.stop(self._record)
