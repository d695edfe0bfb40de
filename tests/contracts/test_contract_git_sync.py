"""Contracts from git against a real git server: two on this machine, the primary and its
mirror, pushed the same commits: two `git daemon`s, and (the story once more) smart HTTP
(`git http-backend` behind Debian's nginx and fcgiwrap) as the primary with a `git daemon`
mirror; commits signed with SSH keys made here by ssh-keygen, the sync process
(`services/contract_sync`, the loop `sco contracts sync` runs) publishing into a NATS
server of the test's own (tests/support/worker_nats.py).

One story, in order: a signed commit is published within one sync interval with its commit
id; a change gets the next serial; its revert a higher serial with the old content; an
unsigned commit and one signed by a key nobody allowed are refused (named, counted) and the
last good bundle stays; a commit that does not compile publishes nothing and names the file
and line; with the primary down the mirror serves the same commit ids; a force-push is
refused until an operator approves that head. Tampered commits (an allowed signer's
signature kept on a rewritten commit, or the signature block altered) are refused as bad
signatures in a test of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from typer.testing import CliRunner

from contracts import keys
from contracts.distribution import NatsBundleSource
from contracts.gitrepo import GitMirror
from contracts.gitsync import NatsSyncStore
from contracts.holders import HoldingReporter
from services.contract_sync import service
from tests.support import tools
from tests.support.paths import REPO
from tests.support.services import free_port
from tests.support.wait import eventually
from tests.support.worker_nats import NATS_URL
from workers.cli.main import app
from workers.settings import Settings

pytestmark = pytest.mark.timeout(240)

INTERVAL = 1.0  # seconds between the sync's fetches


def _tools_or_skip() -> None:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git missing: apt-get install git")
    exec_path = subprocess.run([git, "--exec-path"], capture_output=True, text=True, check=True)
    if not (Path(exec_path.stdout.strip()) / "git-daemon").exists():
        pytest.skip("git daemon missing: apt-get install git-daemon-sysvinit (or a git with it)")
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen missing: apt-get install openssh-client")


class GitDaemon:
    """`git daemon` serving `root` (push allowed) on a port of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, repo: str) -> str:
        return f"git://127.0.0.1:{self.port}/{repo}"

    def start(self) -> None:
        log = (self.root.parent / f"git-daemon-{self.port}.log").open("ab")
        self.proc = subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                "--enable=receive-pack",
                "--listen=127.0.0.1",
                f"--port={self.port}",
                f"--base-path={self.root}",
                str(self.root),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

        def answers() -> bool:
            assert self.proc is not None and self.proc.poll() is None, "git daemon exited"
            done = subprocess.run(
                ["git", "ls-remote", self.url("contracts.git")], capture_output=True, check=False
            )
            return done.returncode == 0

        eventually(answers, timeout=30, what=f"git daemon on {self.port}", retrying=())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


class SmartHttp:
    """Smart HTTP: `git http-backend` (CGI) run by fcgiwrap behind nginx, serving `root`
    (push allowed: http.receivepack) on a port of its own. `stop` takes nginx down (the
    server no longer answers); `start` brings it back on the same port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.run = root.parent / f"http-{self.port}"
        self.run.mkdir()
        self.socket = self.run / "fcgi.sock"
        self.fcgi: subprocess.Popen[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, repo: str) -> str:
        return f"http://127.0.0.1:{self.port}/{repo}"

    def _conf(self) -> Path:
        backend = Path(
            subprocess.run(
                ["git", "--exec-path"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
        r = self.run
        conf = r / "nginx.conf"
        conf.write_text(
            f"""daemon off;
worker_processes 1;
{"user root root;" if os.geteuid() == 0 else ""}
pid {r}/nginx.pid;
error_log {r}/error.log;
events {{ worker_connections 64; }}
http {{
  access_log {r}/access.log;
  client_body_temp_path {r}/body;
  fastcgi_temp_path {r}/fastcgi;
  proxy_temp_path {r}/proxy;
  uwsgi_temp_path {r}/uwsgi;
  scgi_temp_path {r}/scgi;
  client_max_body_size 0;
  server {{
    listen 127.0.0.1:{self.port};
    location / {{
      include /etc/nginx/fastcgi_params;
      fastcgi_pass unix:{self.socket};
      fastcgi_param SCRIPT_FILENAME {backend / "git-http-backend"};
      fastcgi_param GIT_PROJECT_ROOT {self.root};
      fastcgi_param GIT_HTTP_EXPORT_ALL "";
      fastcgi_param PATH_INFO $uri;
    }}
  }}
}}
"""
        )
        return conf

    def start(self) -> None:
        for repo in self.root.glob("*.git"):
            subprocess.run(
                ["git", "--git-dir", str(repo), "config", "http.receivepack", "true"], check=True
            )
        log = (self.run / "server.log").open("ab")
        if self.fcgi is None:
            fcgiwrap = shutil.which("fcgiwrap")
            assert fcgiwrap is not None
            # Its own process group: its forked workers outlive a signal to it alone.
            self.fcgi = subprocess.Popen(
                [fcgiwrap, "-c", "2", "-s", f"unix:{self.socket}"],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        nginx = shutil.which("nginx")
        assert nginx is not None
        self.proc = subprocess.Popen(
            [
                nginx,
                "-p",
                str(self.run),
                "-c",
                str(self._conf()),
                "-e",
                str(self.run / "error.log"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

        def answers() -> bool:
            assert self.proc is not None and self.proc.poll() is None, (
                "nginx exited: " + (self.run / "error.log").read_text()[-1000:]
            )
            assert self.fcgi is not None and self.fcgi.poll() is None, "fcgiwrap exited"
            done = subprocess.run(
                ["git", "ls-remote", self.url("contracts.git")], capture_output=True, check=False
            )
            return done.returncode == 0

        eventually(
            answers, timeout=30, what=f"nginx + git http-backend on {self.port}", retrying=()
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        if self.fcgi is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.fcgi.pid, signal.SIGTERM)
            self.fcgi.wait(timeout=10)


@dataclass
class Author:
    name: str
    key: Path  # SSH private key; .pub beside it


def ssh_key(where: Path, name: str) -> Author:
    key = where / f"{name}_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True
    )
    return Author(name, key)


class WorkTree:
    """The contract authors' clone: commits (signed or not), pushes to both servers."""

    def __init__(self, path: Path, remotes: list[str]) -> None:
        self.path = path
        self.remotes = remotes
        subprocess.run(["git", "init", "--quiet", "-b", "main", str(path)], check=True)

    def git(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        env = {
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_CONFIG_NOSYSTEM": "1",
            "PATH": "/usr/bin:/bin",
        }
        done = subprocess.run(
            ["git", "-C", str(self.path), "-c", "user.name=t", "-c", "user.email=t@x", *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            input=stdin,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"git {args}: {done.stderr}")
        return done.stdout.strip()

    def commit(self, message: str, by: Author | None) -> str:
        sign = (
            ["-c", "gpg.format=ssh", "-c", f"user.signingkey={by.key}", "commit", "-S"]
            if by
            else ["commit"]
        )
        self.git("add", "-A")
        self.git(*sign, "--quiet", "-m", message)
        return self.git("rev-parse", "HEAD")

    def tampered(
        self, signed: str, *, tree: str | None = None, flip_signature: bool = False
    ) -> str:
        """`signed`'s commit object rewritten with its signature block kept: its tree
        swapped for `tree` (the content changed under the author's signature), or one
        character of the signature itself changed. The new object becomes `main`."""
        lines = self.git("cat-file", "commit", signed).split("\n")
        if tree is not None:
            assert lines[0].startswith("tree ")
            lines[0] = f"tree {tree}"
        if flip_signature:
            # The block's third base64 line (inside "gpgsig -----BEGIN SSH SIGNATURE-----").
            body = [
                i for i, x in enumerate(lines) if x.startswith(" ") and "SSH SIGNATURE" not in x
            ]
            i = body[2]
            lines[i] = lines[i][:10] + ("A" if lines[i][10] != "A" else "B") + lines[i][11:]
        raw = "\n".join(lines) + "\n"
        commit = self.git("hash-object", "-t", "commit", "-w", "--stdin", stdin=raw)
        assert commit != signed
        self.git("update-ref", "refs/heads/main", commit)
        self.git("reset", "--quiet", "--hard", commit)
        return commit

    def push(self, *, to: list[str] | None = None, force: bool = False) -> None:
        for url in to or self.remotes:
            self.git("push", "--quiet", *(["--force"] if force else []), url, "main:main")


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@dataclass
class Rig:
    tmp: Path
    primary: GitDaemon | SmartHttp
    mirror: GitDaemon
    work: WorkTree
    alice: Author
    eve: Author
    settings: Settings
    region: str

    def bundle(self) -> dict[str, Any] | None:
        raw = asyncio.run(NatsBundleSource(self.settings.nats_url, self.region).fetch())
        return json.loads(raw)["content"] if raw else None


@pytest.fixture
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    """The primary is a `git daemon`, or with the parameter "http" smart HTTP through nginx;
    the mirror always a `git daemon`."""
    _tools_or_skip()
    transport = getattr(request, "param", "git-daemon")
    if transport == "http":
        tools.require("nginx", "fcgiwrap")  # a skip naming the install command
    srv_a, srv_b = tmp_path / "srv-a", tmp_path / "srv-b"
    for srv in (srv_a, srv_b):
        srv.mkdir()
        subprocess.run(
            ["git", "init", "--bare", "--quiet", "-b", "main", str(srv / "contracts.git")],
            check=True,
        )
    primary: GitDaemon | SmartHttp = SmartHttp(srv_a) if transport == "http" else GitDaemon(srv_a)
    mirror = GitDaemon(srv_b)
    primary.start()
    mirror.start()
    keys_dir = tmp_path / "keys"
    alice, eve = ssh_key(tmp_path, "alice"), ssh_key(tmp_path, "eve")
    trust = tmp_path / "trust"
    _kid, private, public = keys.generate(keys_dir)
    trust.mkdir()
    shutil.copy(public, trust / public.name)
    (trust / "allowed_signers").write_text(
        f"alice@example.org {alice.key.with_suffix('.pub').read_text()}"
    )
    work = WorkTree(tmp_path / "work", [primary.url("contracts.git"), mirror.url("contracts.git")])
    region = f"gs{uuid.uuid4().hex[:8]}"  # the test's own buckets on the shared server
    settings = Settings(
        nats_url=NATS_URL,
        data_dir=tmp_path / "data",
        regions_dir=REPO / "deploy" / "regions",
        contracts={
            "trust_dir": trust,
            "repo_url": primary.url("contracts.git"),
            "mirror_urls": [mirror.url("contracts.git")],
            "ref": "main",
            "path": "contracts",
            "signing_key_file": private,
            "sync_interval_seconds": INTERVAL,
        },
    )
    try:
        yield Rig(tmp_path, primary, mirror, work, alice, eve, settings, region)
    finally:
        primary.close() if isinstance(primary, SmartHttp) else primary.stop()
        mirror.stop()


def _write_examples(work: Path) -> None:
    dest = work / "contracts"
    dest.mkdir(parents=True, exist_ok=True)
    for f in (REPO / "contracts" / "examples").glob("*.yaml"):
        shutil.copy(f, dest / f.name)


def _set_grace(work: Path, seconds: int) -> None:
    path = work / "contracts" / "ci-runners.yaml"
    text = path.read_text()
    import re

    path.write_text(re.sub(r"grace_seconds: \d+", f"grace_seconds: {seconds}", text, count=1))


def _published(rig: Rig, commit: str, within: float) -> tuple[dict[str, Any], float]:
    """The bundle once it names `commit`, and how long that took."""
    start = time.monotonic()

    def names_it() -> dict[str, Any] | None:
        b = rig.bundle()
        return b if b and b.get("source", {}).get("commit") == commit else None

    b = eventually(names_it, timeout=within, what=f"a bundle of commit {commit[:12]}")
    return b, time.monotonic() - start


def _counted(outcome: str, region: str, before: float) -> None:
    eventually(
        lambda: _metric("sco_contract_sync_commits_total", region=region, outcome=outcome) > before,
        # A round (fetch, verify, compile) took over 15 s at load 19 on 2 cores.
        timeout=INTERVAL + 60,
        what=f"a commit counted as {outcome}",
    )


def _head_refused_becomes(region: str, value: float) -> None:
    """The head-refused gauge is set at the end of the round that counted the commit (and
    after the round published), so a reader waits for the round to finish."""
    eventually(
        lambda: _metric("sco_contract_sync_head_refused", region=region) == value,
        timeout=INTERVAL + 60,
        what=f"sco_contract_sync_head_refused={value}",
    )


def _operator_sync_refused(rig: Rig) -> str:
    """`sco contracts sync --once` as an operator runs it (a mirror of its own): it exits 1
    for a refused commit; its output on one line."""
    env = {
        "SCO_NATS_URL": rig.settings.nats_url,
        "SCO_DATA_DIR": str(rig.tmp / "operator"),
        "SCO_REGIONS_DIR": str(rig.settings.regions_dir),
        "SCO_CONTRACTS__TRUST_DIR": str(rig.settings.trust_dir),
        "SCO_CONTRACTS__REPO_URL": rig.primary.url("contracts.git"),
        "SCO_CONTRACTS__SIGNING_KEY_FILE": str(rig.settings.contracts.signing_key_file),
        "COLUMNS": "400",
    }
    args = ["contracts", "sync", "--once", "--region", rig.region]
    res = CliRunner().invoke(app, args, env=env)
    assert res.exit_code == 1, res.output
    return " ".join(res.output.split())


class RunningSync:
    """The sync process's loop (`service.run`) on an event loop of its own thread."""

    def __init__(self, settings: Settings, region: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.stop: asyncio.Event | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(settings, region), daemon=True)
        self.thread.start()
        eventually(lambda: self.stop is not None, timeout=10, what="the sync's loop")

    def _run(self, settings: Settings, region: str) -> None:
        asyncio.set_event_loop(self.loop)

        async def main() -> None:
            self.stop = asyncio.Event()
            await service.run(settings, region, stop=self.stop)

        try:
            self.loop.run_until_complete(main())
        except BaseException as exc:  # shown by close()
            self.error = exc
        finally:
            self.loop.close()

    def close(self) -> None:
        if self.stop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)
        assert not self.thread.is_alive(), "the sync did not stop within 30 s"
        assert self.error is None, f"the sync failed: {self.error!r}"


@pytest.mark.parametrize("rig", ["git-daemon", "http"], indirect=True)
def test_signed_commits_published_refusals_revert_and_mirror(rig: Rig) -> None:
    running = RunningSync(rig.settings, rig.region)
    try:
        _story(rig)
    finally:
        running.close()


def _story(rig: Rig) -> None:
    work, region = rig.work, rig.region
    latencies: list[float] = []
    # 1. The first signed commit: published, naming its commit and signer.
    _write_examples(work.path)
    c1 = work.commit("Contracts", rig.alice)
    work.push()
    b1, took = _published(rig, c1, within=INTERVAL + 90)  # the first fetch clones
    assert b1["source"]["signer"] == "alice@example.org"
    assert b1["source"]["remote"] == rig.primary.url("contracts.git")
    s1 = b1["serial"]

    # 2. A change: the next serial, within one sync interval (plus the step itself).
    _set_grace(work.path, 45)
    c2 = work.commit("ci-runners: 45 s grace", rig.alice)
    work.push()
    b2, took = _published(rig, c2, within=INTERVAL + 60)
    latencies.append(took)
    assert b2["serial"] == s1 + 1
    assert b2["contracts"] != b1["contracts"]

    # 3. Revert: a higher serial, the old content.
    work.git("revert", "--no-edit", "--no-commit", c2)
    c3 = work.commit(f"Revert {c2[:12]}", rig.alice)
    work.push()
    b3, took = _published(rig, c3, within=INTERVAL + 60)
    latencies.append(took)
    assert b3["serial"] == s1 + 2
    assert b3["contracts"] == b1["contracts"]

    # 4. Unsigned, then signed by a key nobody allowed: refused, last good kept.
    before = _metric("sco_contract_sync_commits_total", region=region, outcome="refused-signature")
    unsigned_before = _metric(
        "sco_contract_sync_refused_commits_total", region=region, reason="unsigned", key="-"
    )
    _set_grace(work.path, 5)
    c4 = work.commit("unsigned change", None)
    work.push()
    _counted("refused-signature", region, before)
    assert (
        _metric(
            "sco_contract_sync_refused_commits_total", region=region, reason="unsigned", key="-"
        )
        == unsigned_before + 1
    )
    eve_fp = subprocess.run(
        ["ssh-keygen", "-lf", str(rig.eve.key.with_suffix(".pub"))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    _set_grace(work.path, 6)
    c5 = work.commit("eve's change", rig.eve)
    work.push()
    _counted("refused-signature", region, before + 1)
    assert (
        _metric(
            "sco_contract_sync_refused_commits_total",
            region=region,
            reason="unknown-signer",
            key=eve_fp,
        )
        == 1
    )
    _head_refused_becomes(region, 1)
    held = rig.bundle()
    assert held is not None and held["source"]["commit"] == c3 and held["serial"] == s1 + 2
    assert c4 != c5

    # 5. A signed commit that does not compile: nothing published, the file and line named.
    bad = work.path / "contracts" / "search-api.yaml"
    good_text = bad.read_text()
    bad.write_text(good_text.replace("tier: 1", "tier: 7"))
    c6 = work.commit("broken", rig.alice)
    work.push()
    eventually(
        lambda: _metric("sco_contract_sync_compile_failing", region=region) == 1,
        timeout=15,
        what="the compile failure reported",
    )
    held = rig.bundle()
    assert held is not None and held["source"]["commit"] == c3
    # What an operator runs: one step of its own (its own mirror), the reasons printed.
    said = _operator_sync_refused(rig)
    assert f"{c4[:12]}: REFUSED: commit {c4[:12]} refused: unsigned" in said
    assert f"unknown signer (key {eve_fp})" in said
    bad_line = good_text.splitlines().index("tier: 1") + 1
    where = f"contracts/search-api.yaml:{bad_line}: tier: Input should be less than or equal to 3"
    assert f"{c6[:12]}: compile error, nothing published: {where}" in said, said
    assert f"running serial {s1 + 2}, commit {c3}" in said

    # 6. Primary down: the mirror serves the same commit ids.
    rig.primary.stop()
    bad.write_text(good_text)
    c7 = work.commit("fixed", rig.alice)
    work.push(to=[rig.mirror.url("contracts.git")])
    b7, took = _published(rig, c7, within=INTERVAL + 60)
    assert b7["source"]["remote"] == rig.mirror.url("contracts.git")
    assert b7["serial"] == s1 + 3  # the refused and failing commits took no serial
    # The round's metrics are set when the round returns, just after it publishes.
    eventually(
        lambda: (
            _metric("sco_contract_sync_remote_index", region=region) == 1
            and _metric("sco_contract_sync_compile_failing", region=region) == 0
        ),
        timeout=30,
        what="the mirror's round observed (remote index 1, compiling)",
    )
    assert c6 in work.git("log", "--format=%H", c7)

    # 6b. The primary back but behind (it missed c7), the mirror down: nothing to do,
    # neither a rewrite nor a rollback.
    rig.mirror.stop()
    rig.primary.start()
    eventually(
        lambda: _metric("sco_contract_sync_remote_index", region=region) == 0,
        timeout=INTERVAL + 15,
        what="a fetch from the primary again",
    )
    assert _metric("sco_contract_sync_head_refused", region=region) == 0
    held = rig.bundle()
    assert held is not None and held["source"]["commit"] == c7
    rig.mirror.start()

    # 7. A force-push that drops the published commit: refused until approved.
    work.git("reset", "--hard", c3)
    _set_grace(work.path, 50)
    c8 = work.commit("rewritten history", rig.alice)
    work.push(force=True)
    before = _metric("sco_contract_sync_commits_total", region=region, outcome="rewrite-refused")
    _counted("rewrite-refused", region, before)
    held = rig.bundle()
    assert held is not None and held["source"]["commit"] == c7
    store = NatsSyncStore(rig.settings.nats_url, region, rig.settings.trust_dir)
    asyncio.run(store.approve_rewrite(c8, "operator", "test"))
    b8, _ = _published(rig, c8, within=INTERVAL + 60)
    assert b8["serial"] == s1 + 4

    # What `sco contracts status` reads: the commit of each serial.
    commits = asyncio.run(store.commits([s1, s1 + 1, s1 + 2, s1 + 3, s1 + 4]))
    assert [commits[s].commit for s in sorted(commits)] == [c1, c2, c3, c7, c8]
    # `sco contracts status`: the commit each consumer runs, from the serial it reports.
    for kind, name, serial in (("agent", "node-a1", s1 + 3), ("control", "pod-0", s1 + 4)):
        reporter = HoldingReporter([rig.settings.nats_url], region, kind, name, create_bucket=True)  # type: ignore[arg-type]
        assert asyncio.run(reporter.report(serial))
    env = {
        "SCO_NATS_URL": rig.settings.nats_url,
        "SCO_REGION": region,
        "SCO_CONTRACTS__TRUST_DIR": str(rig.settings.trust_dir),
        "COLUMNS": "200",
    }
    res = CliRunner().invoke(app, ["contracts", "status"], env=env)
    assert res.exit_code == 0, res.output
    assert f"published serial {s1 + 4}, commit {c8[:12]} signed by alice@example.org" in res.stdout
    lines = res.stdout.splitlines()
    node, pod = (next(x for x in lines if name in x) for name in ("node-a1", "pod-0"))
    assert c7[:12] in node and c8[:12] in pod, res.stdout
    # Push -> bundle latency is a figure, not a pass mark (0.6-1.2 s here when the machine
    # is quiet; a loaded CI machine stretches it): the waits above only guard a hang.
    print(
        json.dumps({"sync_latency_seconds": [round(x, 2) for x in latencies], "interval": INTERVAL})
    )


def test_tampered_signatures_refused_as_bad_and_last_good_kept(rig: Rig) -> None:
    """An allowed author's signature that does not verify: the commit object rewritten with
    its signature block kept (the content changed under it), and the signature block
    altered. Each is refused as a bad signature (not as unsigned or an unknown signer),
    named and counted; the last good bundle stays; a good signed commit on top publishes."""
    work, region = rig.work, rig.region
    allowed = rig.settings.trust_dir / "allowed_signers"
    running = RunningSync(rig.settings, rig.region)
    try:
        _write_examples(work.path)
        c1 = work.commit("Contracts", rig.alice)
        work.push()
        b1, _ = _published(rig, c1, within=INTERVAL + 90)
        s1 = b1["serial"]
        refused_before = _metric(
            "sco_contract_sync_commits_total", region=region, outcome="refused-signature"
        )

        def bad_counted() -> float:
            return _metric(
                "sco_contract_sync_refused_commits_total",
                region=region,
                reason="bad-signature",
                key="-",
            )

        # 1. Alice signs a 9 s grace; the commit object is rewritten to carry 99 s under
        # her signature block (as a compromised server or a man in the middle could).
        _set_grace(work.path, 9)
        signed = work.commit("ci-runners: 9 s grace", rig.alice)  # never pushed
        _set_grace(work.path, 99)
        work.git("add", "-A")
        t1 = work.tampered(signed, tree=work.git("write-tree"))
        # git's own verdicts on the two objects: only the rewrite breaks the signature.
        local = GitMirror(work.path / ".git")
        assert local.verify(signed, allowed).good
        v1 = local.verify(t1, allowed)
        assert not v1.good
        assert v1.reason == "bad signature: Signature verification failed: incorrect signature"
        work.push()
        _counted("refused-signature", region, refused_before)
        assert bad_counted() == 1
        _head_refused_becomes(region, 1)

        # 2. Alice signs a 10 s grace; one character of the signature block is changed.
        _set_grace(work.path, 10)
        signed2 = work.commit("ci-runners: 10 s grace", rig.alice)  # never pushed
        t2 = work.tampered(signed2, flip_signature=True)
        assert local.verify(signed2, allowed).good and not local.verify(t2, allowed).good
        work.push()
        _counted("refused-signature", region, refused_before + 1)
        assert bad_counted() == 2
        held = rig.bundle()
        assert held is not None and held["source"]["commit"] == c1 and held["serial"] == s1
        assert held["contracts"] == b1["contracts"]

        # What an operator runs: both named as bad signatures (not unsigned, not unknown).
        said = _operator_sync_refused(rig)
        for t in (t1, t2):
            assert (
                f"{t[:12]}: REFUSED: commit {t[:12]} refused: bad signature: "
                "Signature verification failed: incorrect signature" in said
            ), said
        assert f"running serial {s1}, commit {c1}" in said

        # 3. A good signed commit on top vouches for its own tree: published, next serial.
        _set_grace(work.path, 11)
        c3 = work.commit("ci-runners: 11 s grace", rig.alice)
        work.push()
        b3, _ = _published(rig, c3, within=INTERVAL + 60)
        assert b3["serial"] == s1 + 1
        _head_refused_becomes(region, 0)
        assert bad_counted() == 2  # each refused commit counted once
    finally:
        running.close()
