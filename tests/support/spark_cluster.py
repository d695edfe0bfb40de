"""A real Spark standalone cluster on loopback: one Master, Workers started by the test.

The jars come with the `pyspark` wheel (its package directory is SPARK_HOME) and the JVM
from Debian's JRE; `spark-class` starts each daemon as its own process. Every port is
picked free, every daemon logs to a file in the test's directory and is stopped (TERM,
then KILL) by `close()`. Decommissioning is on in the daemons (`spark.decommission.enabled`),
so a Worker decommissions on SIGPWR.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.services import free_port
from tests.support.wait import WaitTimeout, eventually

HOST = "127.0.0.1"
DAEMON_OPTS = "-Dspark.decommission.enabled=true"
# Every JVM here is short-lived and small: the client compiler and the serial collector
# start it faster and keep it lighter on a shared two-core machine.
JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def get_json(url: str) -> Any:
    # Generous: the first REST call to a busy driver loads its REST layer.
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.load(response)


def wait_for(what: str, check: Any, seconds: float, logs: list[Path]) -> Any:
    """Poll `check()` until it returns something truthy (errors count as not yet)."""
    try:
        return eventually(
            check, timeout=seconds, what=what, every=0.25, retrying=(OSError, ValueError, KeyError)
        )
    except WaitTimeout as exc:
        tails = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
        raise WaitTimeout(f"{exc}\n{tails}") from exc


@dataclass
class SparkDaemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    ui: str


@dataclass
class SparkCluster:
    root: Path
    master_port: int = field(default_factory=free_port)
    master_ui_port: int = field(default_factory=free_port)
    daemons: list[SparkDaemon] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    @property
    def master_ui(self) -> str:
        return f"http://{HOST}:{self.master_ui_port}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": JAVA_OPTS,
            "SPARK_MASTER_OPTS": DAEMON_OPTS,
            "SPARK_WORKER_OPTS": DAEMON_OPTS,
            "SPARK_CONF_DIR": str(self.root / "conf"),
        }

    def _start(self, name: str, argv: list[str], ui: str, host: str = HOST) -> SparkDaemon:
        log = self.root / f"{name}.log"
        command = [str(spark_home() / "bin" / "spark-class"), *argv]
        env = {**self.env(), "SPARK_LOCAL_IP": host}  # its executors inherit it
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.root
            )
        daemon = SparkDaemon(name, proc, log, ui)
        self.daemons.append(daemon)
        return daemon

    def start_master(self) -> SparkDaemon:
        """Started, not waited for: Workers started meanwhile retry until it listens."""
        (self.root / "conf").mkdir(parents=True, exist_ok=True)
        return self._start(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", HOST, "--port", str(self.master_port)),
                *("--webui-port", str(self.master_ui_port)),
            ],
            self.master_ui,
        )

    def start_worker(self, name: str, host: str) -> SparkDaemon:
        """A Worker on its own loopback address (127.0.0.2, ...): one "node" per address,
        as Spark forgets every shuffle output on the host of a Worker it loses."""
        ui_port = free_port()
        work = self.root / name
        work.mkdir(parents=True, exist_ok=True)
        return self._start(
            name,
            [
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                *("--host", host, "--webui-port", str(ui_port)),
                *("--cores", "1", "--memory", "1g", "--work-dir", str(work)),
            ],
            f"http://{host}:{ui_port}",
            host,
        )

    def logs(self) -> list[Path]:
        return [d.log for d in self.daemons]

    def close(self) -> None:
        for daemon in reversed(self.daemons):
            if daemon.proc.poll() is None:
                daemon.proc.terminate()
        for daemon in self.daemons:
            try:
                daemon.proc.wait(15)
            except subprocess.TimeoutExpired:
                daemon.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    daemon.proc.wait(5)
