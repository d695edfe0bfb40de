"""The contract repository as git sees it: a local bare mirror fetched from the remotes in
order, commit signatures checked with `git verify-commit`, a commit's contract folder
exported for the compiler.

Only the `git` binary is used (any server that speaks git: Forgejo, GitLab, `git daemon`,
smart HTTP). Signatures are SSH signatures (`gpg.format=ssh`) checked against an
`allowed_signers` file (ssh-keygen(1) ALLOWED SIGNERS), the trust directory's
`allowed_signers`; a commit that is unsigned, signed by a key not listed there, or whose
signature does not verify is refused with the reason git gave.

Errors: `GitError` for a git command that failed (its stderr in the message);
`RemotesUnreachable` when no remote answered a fetch (each remote's error listed).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ALLOWED_SIGNERS_FILE = "allowed_signers"
#: Where the fetched ref is kept in the mirror.
FETCHED_REF = "refs/sco/fetched"
PUBLISHED_REF = "refs/sco/published"
GIT_TIMEOUT_SECONDS = 60.0
_SIGNER = re.compile(
    r'Good "git" signature for (?P<principal>\S+) with (?P<algo>\S+) key (?P<fp>\S+)'
)
_NO_PRINCIPAL = re.compile(r"No principal matched|is not in the allowed|not found in allowed")


class GitError(RuntimeError):
    """A git command failed; the message holds the command and git's own words."""


class RemotesUnreachable(GitError):
    """No remote answered: `errors` holds each remote's reason, in order."""

    def __init__(self, errors: Sequence[tuple[str, str]]) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(f"{url}: {why}" for url, why in self.errors))


@dataclass(frozen=True)
class Fetched:
    remote: str  # the URL that answered
    index: int  # its place in the list: 0 the primary, 1.. the mirrors
    head: str  # the commit the ref names there
    skipped: tuple[tuple[str, str], ...] = ()  # remotes tried before it, with their errors


@dataclass(frozen=True)
class Signature:
    """`git verify-commit`'s verdict on one commit."""

    commit: str
    good: bool
    signer: str  # the principal of allowed_signers ("" when refused)
    key: str  # the key's fingerprint ("" when unknown)
    reason: str  # why refused: "unsigned", "unknown signer ...", "bad signature ..."


def _ref(ref: str) -> str:
    return ref if ref.startswith("refs/") else f"refs/heads/{ref}"


def _quiet_env() -> dict[str, str]:
    env = dict(os.environ)
    # No user or system configuration changes what we verify (signing keys, hooks, helpers).
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", GIT_TERMINAL_PROMPT="0")
    env.pop("GIT_DIR", None)
    return env


class GitMirror:
    """A bare repository at `path` holding what the remotes last had under FETCHED_REF."""

    def __init__(self, path: Path, *, git: str = "git", timeout: float = GIT_TIMEOUT_SECONDS):
        self.path = path
        self._git = git
        self._timeout = timeout

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        cmd = [self._git, "--git-dir", str(self.path), *args]
        try:
            done = subprocess.run(
                cmd, capture_output=True, timeout=self._timeout, env=_quiet_env(), check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise GitError(f"git {' '.join(args)}: no answer in {self._timeout:g} s") from exc
        if check and done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
            raise GitError(f"git {' '.join(args)}: {why}")
        return done

    def _out(self, *args: str) -> str:
        return self._run(*args).stdout.decode().strip()

    def ensure(self) -> None:
        if not (self.path / "HEAD").exists():
            self.path.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [self._git, "init", "--bare", "--quiet", str(self.path)],
                check=True,
                capture_output=True,
                env=_quiet_env(),
                timeout=self._timeout,
            )

    def fetch(self, remotes: Sequence[str], ref: str) -> Fetched:
        """Fetch `ref` from the first remote that answers (primary first, then mirrors)."""
        self.ensure()
        errors: list[tuple[str, str]] = []
        for i, url in enumerate(remotes):
            try:
                self._run("fetch", "--quiet", "--no-tags", url, f"+{_ref(ref)}:{FETCHED_REF}")
            except GitError as exc:
                errors.append((url, str(exc).splitlines()[-1] if str(exc) else "failed"))
                continue
            return Fetched(url, i, self._out("rev-parse", FETCHED_REF), tuple(errors))
        raise RemotesUnreachable(errors)

    def has(self, commit: str) -> bool:
        return self._run("cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0

    def is_ancestor(self, ancestor: str, commit: str) -> bool:
        """True when `ancestor` is `commit` or in its history (false when it is unknown)."""
        if not self.has(ancestor):
            return False
        done = self._run("merge-base", "--is-ancestor", ancestor, commit, check=False)
        return done.returncode == 0

    def new_commits(self, since: str | None, head: str) -> list[str]:
        """The commits on `head`'s first-parent line after `since`, oldest first (only
        `head` when nothing was published yet)."""
        if since is None:
            return [head]
        out = self._out("rev-list", "--first-parent", "--reverse", f"{since}..{head}")
        return out.split()

    def verify(self, commit: str, allowed_signers: Path) -> Signature:
        if not allowed_signers.is_file():
            return Signature(commit, False, "", "", f"no {allowed_signers}: nobody may sign")
        done = self._run(
            "-c",
            "gpg.format=ssh",
            "-c",
            f"gpg.ssh.allowedSignersFile={allowed_signers}",
            "verify-commit",
            "--raw",
            commit,
            check=False,
        )
        said = (done.stderr + done.stdout).decode(errors="replace").strip()
        match = _SIGNER.search(said)
        if done.returncode == 0 and match is not None:
            return Signature(commit, True, match["principal"], match["fp"], "")
        if not said or "no signature" in said.lower():
            return Signature(commit, False, "", "", "unsigned")
        fp = re.search(r"(SHA256:\S+)", said)
        if _NO_PRINCIPAL.search(said):
            key = fp.group(1) if fp else "?"
            return Signature(commit, False, "", key, f"unknown signer (key {key})")
        # git says "Could not verify signature." first; ssh-keygen's own line says why
        # ("Signature verification failed: incorrect signature" for a tampered commit).
        lines = said.splitlines() or [f"exit {done.returncode}"]
        why = next((x for x in lines if "failed" in x.lower()), lines[0])
        return Signature(commit, False, "", fp.group(1) if fp else "", f"bad signature: {why}")

    def keep(self, commit: str) -> None:
        """Keep `commit` (the last published) reachable here, so a later fetch that rewrote
        or lags behind it can still be compared with it."""
        self._run("update-ref", PUBLISHED_REF, commit)

    def resolve(self, rev: str) -> str:
        """The full commit id `rev` names (a branch, tag, short id, HEAD~1)."""
        return self._out("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")

    def subject(self, commit: str) -> str:
        return self._out("log", "-1", "--format=%s", commit)

    def trailer(self, commit: str, key: str) -> str | None:
        out = self._out("log", "-1", f"--format=%(trailers:key={key},valueonly)", commit)
        return out.splitlines()[0].strip() if out else None

    def export(self, commit: str, path: str, dest: Path) -> Path:
        """Write `path` (a folder) of `commit` under `dest`; return the folder written."""
        spec = f"{commit}:{path.strip('/')}" if path.strip("/") else commit
        done = self._run("archive", "--format=tar", spec)
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
            tar.extractall(dest, filter="data")
        return dest
