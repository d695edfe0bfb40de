"""The checkpoint socket as a trust boundary: the job's workload runs as its own
unprivileged user, the agent as its own, in the directories the shipped unit makes
(tests/support/checkpoint_users.py reads them from deploy/agent/sco-agent.service).

Each attack from the trust-boundary review is a test named for it; a Hypothesis fuzzer
checks that whatever a workload answers, a drain ends checkpointed or forced, in time.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.checkpoint import naming, register
from agent.checkpoint.protocol import MAX_LINE, Request
from agent.checkpoint.server import default_socket_path
from agent.drain import DrainEngine
from agent.notices import Notice
from agent.scheduler import pod_cgroup_markers
from agent.scheduler.kubernetes import KubernetesScheduler
from tests.support.agent_fakes import RecordingScheduler
from tests.support.checkpoint_roles import training_bundle, training_job
from tests.support.checkpoint_users import (
    Layout,
    User,
    can_run_users,
    make_user,
    remove_user,
    run_role,
    shipped_layout,
    start_role,
    stop_role,
    unit_directives,
)
from tests.support.fuzz import examples
from tests.support.wait import WaitTimeout, eventually

pytestmark = pytest.mark.timeout(90)


@dataclass(frozen=True)
class Users:
    agent: User
    alice: User
    bob: User


@pytest.fixture(scope="session")
def users() -> Iterator[Users]:
    """An agent user and two tenants of their own (removed after the session)."""
    if why := can_run_users():
        pytest.skip(f"checkpoint trust tests: {why}")
    made: list[User] = []
    try:
        for prefix in ("scoag", "scoal", "scobo"):
            made.append(make_user(prefix))
        yield Users(*made)
    finally:
        for user in made:
            remove_user(user)


@pytest.fixture
def layout(users: Users) -> Iterator[Layout]:
    """The unit's runtime directories, owned by the agent user, under a root of our own
    that every user may enter (pytest's tmp_path is root's only)."""
    root = Path(tempfile.mkdtemp(prefix="sco-ckpt-", dir="/tmp"))
    os.chmod(root, 0o755)
    try:
        yield shipped_layout(root, users.agent)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def agent_sync(layout: Layout, wanted: dict[str, int | None]) -> dict[str, Any]:
    spec = {"role": "sync", "socket_dir": str(layout.socket_dir), "wanted": wanted}
    [result] = run_role(layout.agent, spec, caps=layout.ambient_caps)
    return result


def agent_drain(layout: Layout, workloads: list[dict[str, Any]], bound: float) -> dict[str, Any]:
    spec = {
        "role": "drain",
        "socket_dir": str(layout.socket_dir),
        "workloads": workloads,
        "bound": bound,
    }
    [result] = run_role(layout.agent, spec, caps=layout.ambient_caps)
    return result


def slurm_job_served_by(layout: Layout, user: User, job: str, delay: float = 0.0) -> Any:
    """`user`'s workload of Slurm job `job`, registered at its default socket path."""
    env = {"SLURM_JOB_ID": job, "SCO_CHECKPOINT_SOCKET_DIR": str(layout.socket_dir)}
    proc = start_role(user, {"role": "serve", "delay": delay}, env)
    sock = naming.job_socket(layout.socket_dir, naming.slurm_job(job))

    def up() -> bool:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        return sock.exists()

    eventually(up, timeout=30, what=f"{sock} to appear")
    return proc


# --- the layout as shipped ---------------------------------------------------------------


def test_the_unit_hands_the_agent_an_untouchable_socket_dir_and_only_cap_chown() -> None:
    """The unit's socket dir is the agent's, enterable but not writable by tenants."""
    unit = unit_directives()
    mode = int(unit["RuntimeDirectoryMode"][-1], 8)
    assert mode & 0o022 == 0, "tenants must not create anything in the socket dir"
    assert mode & 0o001, "tenants must be able to pass through to their job's directory"
    assert unit["AmbientCapabilities"] == ["CAP_CHOWN"]
    assert unit["CapabilityBoundingSet"] == ["CAP_CHOWN"]
    assert unit["RuntimeDirectoryPreserve"] == ["yes"]  # sockets outlive an agent restart
    assert "sco-agent/checkpoint" in unit["RuntimeDirectory"][0].split()


def test_a_job_of_its_own_user_checkpoints_through_the_shipped_layout(
    users: Users, layout: Layout
) -> None:
    """The agent makes the job's directory; the job registers; the agent checkpoints it."""
    name = naming.slurm_job("4201")
    made = agent_sync(layout, {name: users.alice.uid})
    assert made["made"] == [name] and not made["failed"]
    job_dir = layout.socket_dir / name
    st_ = os.lstat(job_dir)
    assert (st_.st_uid, st_.st_gid) == (users.alice.uid, users.agent.gid)
    assert stat.S_IMODE(st_.st_mode) == 0o770
    proc = slurm_job_served_by(layout, users.alice, "4201")
    job = {"job": "4201", "socket_name": name, "uid": users.alice.uid, "gid": users.alice.gid}
    result = agent_drain(layout, [job], bound=20)
    lines, err = stop_role(proc)
    assert result["outcomes"]["4201"] == {
        "result": "checkpointed",
        "detail": "",
        "path": f"file:///ckpt/{users.alice.uid}",
        "lost_steps": 3,
    }, err[-2000:]
    assert result["ops"] == [["cordon", "n1"], ["requeue", "4201"]]
    assert {"called": "reclaim"} in lines
    # The job leaves: the agent's next pass removes its directory.
    assert agent_sync(layout, {})["removed"] == [name]
    assert not job_dir.exists()


@pytest.mark.timeout(240)
def test_a_job_started_before_its_directory_waits_for_the_agent(
    users: Users, layout: Layout
) -> None:
    """A workload that starts before the agent's pass registers once the directory exists."""
    name = naming.slurm_job("4202")
    env = {"SLURM_JOB_ID": "4202", "SCO_CHECKPOINT_SOCKET_DIR": str(layout.socket_dir)}
    # The role waits this long for its directory; the agent's pass is a process of its own.
    proc = start_role(users.alice, {"role": "serve", "listen_within": 120}, env)
    try:
        assert proc.poll() is None
        assert not (layout.socket_dir / name).exists()  # it cannot make it itself
        made = agent_sync(layout, {name: users.alice.uid})
        sock = naming.job_socket(layout.socket_dir, name)
        try:
            eventually(sock.exists, timeout=60, what=f"{sock} to appear")
        except WaitTimeout as exc:
            # Under load this once timed out at 30 s: say what the workload saw.
            lines, err = stop_role(proc)
            raise AssertionError(f"{exc}; agent pass {made}; role {lines}: {err[-2000:]}") from None
    finally:
        if proc.returncode is None:
            stop_role(proc)


# --- attacks -----------------------------------------------------------------------------


def test_another_tenant_cannot_make_a_job_save_and_exit(users: Users, layout: Layout) -> None:
    """Attack: a tenant connects to another job's socket and asks it to checkpoint."""
    name = naming.slurm_job("4301")
    agent_sync(layout, {name: users.alice.uid})
    proc = slurm_job_served_by(layout, users.alice, "4301")
    sock = str(naming.job_socket(layout.socket_dir, name))
    try:
        [attempt] = run_role(users.bob, {"role": "attack", "path": sock})
        assert attempt["error"] == "PermissionError", attempt  # the directory keeps bob out
        # Even with the directory opened to everyone, the workload answers only the agent.
        os.chmod(layout.socket_dir / name, 0o771)
        [attempt] = run_role(users.bob, {"role": "attack", "path": sock})
        assert "reply" in attempt, attempt
        reply = json.loads(attempt["reply"])
        assert reply["ok"] is False and "not the node agent" in reply["error"], attempt
    finally:
        lines, _ = stop_role(proc)
    assert not any("called" in line for line in lines)  # nothing saved, nothing exited


def test_a_tenant_cannot_squat_another_jobs_socket_to_record_a_fake_checkpoint(
    users: Users, layout: Layout
) -> None:
    """Attack: a tenant answers under another job's socket name with 0 lost steps."""
    name = naming.slurm_job("4401")
    [attempt] = run_role(users.bob, {"role": "mkdir", "path": str(layout.socket_dir / name)})
    assert attempt["error"] == "PermissionError", attempt  # no name can be taken first
    # Say bob got there anyway (the directory the agent made for an earlier job of his
    # under that name): his impostor answers a perfect checkpoint. The agent holds the
    # socket to the job's owner, alice.
    squat = layout.socket_dir / name
    squat.mkdir()
    os.chmod(squat, 0o770)
    os.chown(squat, users.bob.uid, users.agent.gid)
    fake = '{"v": 1, "ok": true, "path": "s3://fake", "lost_steps": 0}\n'
    sock = naming.job_socket(layout.socket_dir, name)
    proc = start_role(users.bob, {"role": "serve_raw", "path": str(sock), "reply": fake})
    try:
        eventually(sock.exists, timeout=30, what=f"{sock} to appear")
        job = {"job": "4401", "socket_name": name, "uid": users.alice.uid}
        outcome = agent_drain(layout, [job], bound=10)["outcomes"]["4401"]
    finally:
        lines, _ = stop_role(proc)
    assert outcome["result"] == "forced", outcome
    assert outcome["path"] == "" and outcome["lost_steps"] is None
    assert "owned by uid" in outcome["detail"]
    assert not any("asked" in line for line in lines)  # never even spoken to
    # The agent's next pass hands the name back to its job.
    synced = agent_sync(layout, {name: users.alice.uid})
    assert synced["removed"] == [name] and synced["made"] == [name], synced
    assert os.lstat(squat).st_uid == users.alice.uid


def test_a_socket_served_by_another_uid_is_refused_by_peer_credentials(
    users: Users, layout: Layout
) -> None:
    """Attack: the job's directory and socket are the job's, the listener is not."""
    name = naming.slurm_job("4402")
    agent_sync(layout, {name: users.bob.uid})
    fake = '{"v": 1, "ok": true, "path": "s3://fake", "lost_steps": 0}\n'
    sock = naming.job_socket(layout.socket_dir, name)
    proc = start_role(users.bob, {"role": "serve_raw", "path": str(sock), "reply": fake})
    try:
        eventually(sock.exists, timeout=30, what=f"{sock} to appear")
        # The scheduler says the job runs as bob but in alice's group: the listener's gid
        # (SO_PEERCRED) is bob's own, so it is not the job's process.
        job = {"job": "4402", "socket_name": name, "uid": users.bob.uid, "gid": users.alice.gid}
        outcome = agent_drain(layout, [job], bound=10)["outcomes"]["4402"]
    finally:
        stop_role(proc)
    assert outcome["result"] == "forced", outcome
    assert "gid" in outcome["detail"] and outcome["lost_steps"] is None


def test_colliding_kubernetes_names_map_to_distinct_sockets() -> None:
    """Attack: pod team/a-trainer takes the socket of pod team-a/trainer."""
    a, b = naming.pod("team-a", "trainer"), naming.pod("team", "a-trainer")
    assert a != b
    env_a = {"POD_NAMESPACE": "team-a", "POD_NAME": "trainer", "SCO_CHECKPOINT_SOCKET_DIR": "/s"}
    env_b = {"POD_NAMESPACE": "team", "POD_NAME": "a-trainer", "SCO_CHECKPOINT_SOCKET_DIR": "/s"}
    assert default_socket_path(env_a) != default_socket_path(env_b)
    assert default_socket_path(env_a) == naming.job_socket(Path("/s"), a)

    class Listed(KubernetesScheduler):
        async def _acall(self, method: str, path: str, body: Any = None, ctype: str = "") -> Any:
            def pod(ns: str, name: str, uid: str, run_as: int) -> dict[str, Any]:
                return {
                    "metadata": {"namespace": ns, "name": name, "uid": uid},
                    "spec": {"securityContext": {"runAsUser": run_as, "runAsGroup": run_as},
                             "containers": [{"name": "c"}]},
                    "status": {"phase": "Running"},
                }  # fmt: skip

            return {
                "items": [
                    pod("team-a", "trainer", "u-1", 1001),
                    pod("team", "a-trainer", "u-2", 1002),
                ]
            }

    found = asyncio.run(Listed("http://unused", dry_run=True).workloads("n1"))
    assert [w.socket_name for w in found] == [a, b]
    assert [(w.uid, w.gid) for w in found] == [(1001, 1001), (1002, 1002)]
    assert found[0].owner().cgroup_markers == ("podu-1", "podu_1")


@given(
    st.tuples(st.text(max_size=80), st.text(max_size=300)),
    st.tuples(st.text(max_size=80), st.text(max_size=300)),
)
@settings(derandomize=True, max_examples=300, deadline=None)
def test_pod_names_never_collide_and_stay_short(
    one: tuple[str, str], other: tuple[str, str]
) -> None:
    """Any two different pods have different socket names, each one path component."""
    a, b = naming.pod(*one), naming.pod(*other)
    assert (a == b) == (one == other)
    for name in (a, b):
        assert "/" not in name and name not in (".", "..") and len(name) <= naming.MAX_READABLE
        assert len(str(naming.job_socket(Path("/run/sco-agent/checkpoint"), name))) < 108


# --- the drain against what a workload answers (in-process, as root) ---------------------


def engine(socket_dir: Path) -> tuple[DrainEngine, RecordingScheduler]:
    scheduler = RecordingScheduler([training_job("7", naming.slurm_job("7"))])
    return DrainEngine(scheduler, socket_dir, dry_run=False, safety_margin_seconds=0.0), scheduler


async def drain_once(socket_dir: Path, bound: float) -> tuple[dict[str, Any], float]:
    drainer, scheduler = engine(socket_dir)
    deadline = datetime.now(UTC) + timedelta(seconds=bound)
    started = time.monotonic()
    report = await drainer.drain(Notice("x", "n1", deadline, "reclaim", "t"), training_bundle(), 1)
    [outcome] = report.workloads
    return {
        "result": outcome.result,
        "detail": outcome.detail,
        "lost_steps": outcome.lost_steps,
        "ops": scheduler.ops(),
    }, time.monotonic() - started


class RawWorkload:
    """An in-process listener at job 7's socket answering `reply` (bytes) to everyone;
    `None` never answers."""

    def __init__(self, socket_dir: Path) -> None:
        self.path = naming.job_socket(socket_dir, naming.slurm_job("7"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.reply: bytes | None = b""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        self._sock.listen(8)
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            reply = self.reply
            if reply is None:
                self._held = conn  # kept open, never answered
                continue
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(4096)
                    conn.sendall(reply)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


@pytest.fixture
def raw_workload(tmp_path: Path) -> Iterator[RawWorkload]:
    server = RawWorkload(tmp_path / "s")
    yield server
    server.close()


async def test_one_slow_connection_does_not_block_the_server(tmp_path: Path) -> None:
    """Attack: a connection that never sends its request holds the workload's server."""
    sockets = tmp_path / "s"
    sock = naming.job_socket(sockets, naming.slurm_job("7"))
    server = register(lambda reason, deadline: "file:///ckpt/7", socket_path=sock)
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        slow.connect(str(sock))  # and says nothing
        outcome, took = await drain_once(sockets, bound=4)
    finally:
        slow.close()
        server.close()
    assert outcome["result"] == "checkpointed", outcome
    assert took < 2, took


MALFORMED = {
    "a 5,000-digit number": b'{"v": 1, "ok": true, "lost_steps": ' + b"9" * 5000 + b"}\n",
    "a line past the limit": b'{"v": 1, "ok": true, "path": "' + b"x" * MAX_LINE + b'"}\n',
    "deep nesting": b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "ok is not a boolean": b'{"v": 1, "ok": "yes"}\n',
    "lost_steps true": b'{"v": 1, "ok": true, "lost_steps": true}\n',
    "a path that is an object": b'{"v": 1, "ok": true, "path": {"a": 1}}\n',
    "not UTF-8": b"\xff\xfe\xfd\n",
    "no newline, then closed": b'{"v": 1, "ok": true}',
    "closed without a word": b"",
    "NaN": b'{"v": 1, "ok": true, "lost_steps": NaN}\n',
}


@pytest.mark.parametrize("reply", list(MALFORMED), ids=list(MALFORMED))
async def test_a_malformed_reply_forces_the_job_never_neither(
    raw_workload: RawWorkload, tmp_path: Path, reply: str
) -> None:
    """Attack: a malformed reply leaves the job neither requeued nor forced."""
    raw_workload.reply = MALFORMED[reply]
    outcome, took = await drain_once(tmp_path / "s", bound=5)
    assert outcome["result"] == "forced", outcome
    assert outcome["ops"] == [("cordon", "n1"), ("force", "7")]
    assert took < 5


async def test_a_reply_that_never_comes_forces_the_job_at_the_bound(
    raw_workload: RawWorkload, tmp_path: Path
) -> None:
    """Attack: a workload that accepts and never answers holds the drain."""
    raw_workload.reply = None
    outcome, took = await drain_once(tmp_path / "s", bound=1.5)
    assert outcome["result"] == "forced" and "no answer" in outcome["detail"], outcome
    assert 1.0 < took < 3.0, took


async def test_lost_steps_of_2_to_the_63_is_refused(
    raw_workload: RawWorkload, tmp_path: Path
) -> None:
    """Attack: a workload reports 2**63 lost steps (it crashed the ledger's intake)."""
    raw_workload.reply = b'{"v": 1, "ok": true, "path": "p", "lost_steps": %d}\n' % 2**63
    outcome, _ = await drain_once(tmp_path / "s", bound=5)
    assert outcome["result"] == "forced" and outcome["lost_steps"] is None, outcome
    assert "lost_steps" in outcome["detail"]


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_replies = st.one_of(
    st.binary(max_size=200),
    st.fixed_dictionaries(
        {"v": st.sampled_from([1, 1, 2, "1", None])},
        optional={
            "ok": st.sampled_from([True, False, 1, "true", None]),
            "path": _json_values,
            "error": _json_values,
            "lost_steps": st.integers(min_value=-(2**70), max_value=2**70) | _json_values,
            "lost_tasks": st.integers(min_value=-(2**70), max_value=2**70) | _json_values,
        },
    ).map(lambda doc: json.dumps(doc).encode() + b"\n"),
)


@given(reply=_replies)
@settings(
    derandomize=True,
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_whatever_a_workload_answers_the_job_is_checkpointed_or_forced_in_time(
    raw_workload: RawWorkload, tmp_path: Path, reply: bytes
) -> None:
    """Fuzz: any reply ends in checkpointed or forced, within the deadline."""
    raw_workload.reply = reply
    outcome, took = asyncio.run(drain_once(tmp_path / "s", bound=2))
    assert outcome["result"] in ("checkpointed", "forced"), (reply, outcome)
    assert took < 2.5, (reply, took)
    if outcome["result"] == "checkpointed":
        assert outcome["lost_steps"] is None or 0 <= outcome["lost_steps"] <= 10**9
        assert outcome["ops"] == [("cordon", "n1"), ("requeue", "7")]
    else:
        assert outcome["ops"] == [("cordon", "n1"), ("force", "7")]


def test_requests_are_bounded_too() -> None:
    """The workload refuses a request whose deadline is not a finite number."""
    from agent.checkpoint.protocol import ProtocolError, decode_request

    for bad in (
        b'{"v":1,"op":"checkpoint","deadline":NaN}',
        b'{"v":1,"op":"ping","deadline":true}',
    ):
        with pytest.raises(ProtocolError):
            decode_request(bad)
    assert decode_request(Request("ping", "", 1.0).encode().strip()).op == "ping"


def test_the_check_fails_on_a_socket_dir_others_can_write(tmp_path: Path) -> None:
    """`sco-agent --check` refuses a socket dir in which tenants could take names."""
    from agent.check import _sockets
    from tests.support.agent_fakes import agent_config

    config = agent_config(tmp_path, node="n1", scheduler="slurm")
    assert _sockets(config).ok  # not there yet: the unit makes it
    config.socket_dir.mkdir()
    os.chmod(config.socket_dir, 0o711)
    assert _sockets(config).ok
    os.chmod(config.socket_dir, 0o1777)
    line = _sockets(config)
    assert not line.ok and "no one else can write" in line.detail


async def test_a_pod_socket_served_outside_the_pods_cgroup_is_refused(tmp_path: Path) -> None:
    """Attack: a process of the right uid but not in the pod answers for the pod."""
    sockets = tmp_path / "s"
    name = naming.pod("training", "trainer-0")
    server = register(lambda reason, deadline: "file:///fake", socket_path=sockets / name / "sock")
    pod = training_job(
        "training/trainer-0",
        name,
        uid=os.geteuid(),
        cgroup_markers=pod_cgroup_markers("1f2e-3d4c"),
    )
    scheduler = RecordingScheduler([pod])
    drainer = DrainEngine(scheduler, sockets, dry_run=False, safety_margin_seconds=0.0)
    deadline = datetime.now(UTC) + timedelta(seconds=5)
    try:
        report = await drainer.drain(
            Notice("p", "n1", deadline, "reclaim", "t"), training_bundle(), 1
        )
    finally:
        server.close()
    [outcome] = report.workloads
    assert outcome.result == "forced" and "cgroup" in outcome.detail, outcome
    assert not server.answered.is_set()


def test_the_peer_check_reads_the_pods_cgroup(tmp_path: Path) -> None:
    """A listener in the pod's cgroup (either cgroup driver's spelling) is the pod's."""
    from agent.checkpoint.peer import JobOwner, PeerCredentials, PeerRefused, check_peer

    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    owner = JobOwner(uid=1000, gid=None, cgroup_markers=("pod1f2e-3d4c", "pod1f2e_3d4c"))
    peer = PeerCredentials(pid=42, uid=1000, gid=1000)
    for line in (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e_3d4c.slice/cri-x\n",
        "0::/kubepods/besteffort/pod1f2e-3d4c/0123abcd\n",
    ):
        (proc / "42" / "cgroup").write_text(line)
        check_peer(peer, 1000, owner, proc)
    (proc / "42" / "cgroup").write_text("0::/user.slice/user-1000.slice/session-3.scope\n")
    with pytest.raises(PeerRefused, match="cgroup"):
        check_peer(peer, 1000, owner, proc)
    with pytest.raises(PeerRefused, match="uid"):
        check_peer(PeerCredentials(42, 1001, 1000), 1000, owner, proc)


async def test_a_slurm_array_task_is_found_by_the_name_its_job_registers_under() -> None:
    """An array task (`123_4`, SLURM_JOB_ID 125): its socket name and cgroup are 125's."""
    from agent.scheduler.slurm import SlurmScheduler

    class Listed(SlurmScheduler):
        async def _run(self, *args: str) -> str:
            return "123_4|125|mlr|spot|RUNNING|1700000000|1000|1001|sco-contract=llm-train\n"

    [job] = await Listed(dry_run=True, cgroup_check=True).workloads("n1")
    assert job.id == "123_4"  # what scontrol is told
    assert job.socket_name == naming.name_from_env({"SLURM_JOB_ID": "125"}, 1)
    assert (job.uid, job.gid, job.cgroup_markers) == (1000, 1001, ("/job_125/",))
    [job] = await Listed(dry_run=True).workloads("n1")
    assert job.cgroup_markers == ()
