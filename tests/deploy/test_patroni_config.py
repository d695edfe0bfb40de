"""The shipped Patroni configuration passes `patroni --validate-config` (the venv's Patroni,
or Patroni from PyPI in a throwaway venv), apart from what only the real hosts can satisfy
(their names resolving, port 5432 free, PostgreSQL 16's binaries), and keeps TLS wired end
to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import REPO

CONFIG = REPO / "deploy" / "patroni" / "patroni-r1.example.yml"
#: Validation findings about the machine the check runs on, not about the file.
HOST_ONLY = (
    "Name or service not known",
    "Temporary failure in name resolution",
    "is already in use",
    "does not exist",
)


@pytest.fixture(scope="module")
def patroni(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The dev extra has it (the failover tests' cluster); else a throwaway venv.
    ours = Path(sys.executable).parent / "patroni"
    if ours.exists():
        return ours
    venv = tmp_path_factory.mktemp("patroni-venv")
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True)
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "patroni[etcd3]", "psycopg2-binary"],
        capture_output=True,
        timeout=240,
    )
    if made.returncode or pip.returncode:
        pytest.skip("patroni could not be installed from PyPI: --validate-config skipped")
    return venv / "bin" / "patroni"


@pytest.mark.timeout(300)
def test_shipped_config_validates(patroni: Path) -> None:
    out = subprocess.run(
        [str(patroni), "--validate-config", str(CONFIG)], capture_output=True, text=True, timeout=60
    )
    findings = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    about_the_file = [f for f in findings if not any(h in f for h in HOST_ONLY)]
    assert about_the_file == []


def test_tls_everywhere_and_a_loopback_rule() -> None:
    conf = yaml.safe_load(CONFIG.read_text())
    params = conf["bootstrap"]["dcs"]["postgresql"]["parameters"]
    assert params["ssl"] == "on" and params["ssl_cert_file"] and params["ssl_key_file"]
    hba = conf["postgresql"]["pg_hba"]
    assert any(r.startswith("local all postgres") for r in hba)
    assert any("127.0.0.1/32" in r for r in hba)
    remote = [
        r for r in hba if not r.startswith("local") and "127.0.0.1" not in r and "::1" not in r
    ]
    assert remote and all(r.startswith("hostssl") for r in remote)
    api = conf["restapi"]
    assert not api["listen"].startswith("0.0.0.0")
    assert api["authentication"]["username"] and api["certfile"] and api["keyfile"]
    etcd = conf["etcd3"]
    assert etcd["protocol"] == "https" and etcd["cacert"] and etcd["cert"] and etcd["key"]
