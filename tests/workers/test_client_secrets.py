"""Secrets come from files and are never printed: settings repr, `sco dev status`, errors;
TLS and SASL settings reach the client libraries as they expect them."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from workers.cli.main import app
from workers.client_security import (
    SecretFileError,
    kafka_config,
    ledger_options,
    postgres_conninfo,
)
from workers.settings import Settings, SettingsError, load_settings

SECRETS = ("pw-in-dsn", "pw-ledger", "tok-rest", "pw-from-file", "pw-kafka")


@pytest.fixture
def secret_files(tmp_path: Path) -> dict[str, Path]:
    files = {name: tmp_path / name for name in ("pg", "kafka", "ledger", "slurm")}
    files["pg"].write_text("pw-from-file\n")
    files["kafka"].write_text("pw-kafka\n")
    files["ledger"].write_text("pw-ledger\n")
    files["slurm"].write_text("tok-rest\n")
    return files


def secret_settings(files: dict[str, Path]) -> Settings:
    return Settings(
        postgres_dsn="postgresql://sco:pw-in-dsn@127.0.0.1:1/sco?connect_timeout=2",
        ledger_dsn="https://sco:pw-ledger@127.0.0.1:1/",
        postgres={"sslmode": "verify-full", "password_file": files["pg"]},
        kafka={
            "tls": {"enabled": True},
            "sasl_username": "sco",
            "sasl_password_file": files["kafka"],
        },
        ledger={"password_file": files["ledger"]},
        slurm={"rest_token": "tok-rest"},
    )


def test_settings_repr_shows_no_secret(secret_files: dict[str, Path]) -> None:
    s = secret_settings(secret_files)
    for text in (repr(s), str(s), repr(s.slurm), repr(s.postgres), repr(s.kafka)):
        assert not [x for x in SECRETS if x in text], text
    assert "postgresql://sco:***@127.0.0.1:1/sco" in repr(s)


def test_a_multi_host_conninfo_shows_no_password() -> None:
    """Patroni's members in one key=value connection string: the password is redacted."""
    dsn = (
        "host=10.0.0.1,10.0.0.2,10.0.0.3 port=5432,5432,5432 dbname=sco user=sco "
        "password='s3 cret' target_session_attrs=read-write"
    )
    shown = repr(Settings(postgres_dsn=dsn))
    assert "s3 cret" not in shown
    assert "password=*** target_session_attrs=read-write" in shown
    url = "postgresql://sco:s3cret@10.0.0.1:5432,10.0.0.2:5432/sco?target_session_attrs=read-write"
    shown = repr(Settings(postgres_dsn=url))
    assert "s3cret" not in shown and "sco:***@10.0.0.1:5432,10.0.0.2:5432/sco" in shown


def test_secret_files_reach_the_clients(secret_files: dict[str, Path]) -> None:
    s = secret_settings(secret_files)
    conninfo = postgres_conninfo(s)
    assert "password=pw-from-file" in conninfo and "sslmode=verify-full" in conninfo
    assert ledger_options(s)["password"] == "pw-ledger"
    k = kafka_config(s.kafka)
    assert k["security.protocol"] == "SASL_SSL" and k["sasl.password"] == "pw-kafka"
    Producer({"bootstrap.servers": "127.0.0.1:1", **k})  # librdkafka accepts every key


def test_a_database_error_does_not_repeat_the_password(secret_files: dict[str, Path]) -> None:
    with pytest.raises(psycopg.OperationalError) as failed:
        psycopg.connect(postgres_conninfo(secret_settings(secret_files))).close()
    assert not [x for x in SECRETS if x in str(failed.value)]


def test_sco_dev_status_shows_no_secret(
    secret_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SCO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SCO_POSTGRES_DSN", "postgresql://sco:pw-in-dsn@127.0.0.1:1/sco")
    monkeypatch.setenv("SCO_LEDGER_DSN", "https://sco:pw-ledger@127.0.0.1:1/")
    monkeypatch.setenv("SCO_POSTGRES__PASSWORD_FILE", str(secret_files["pg"]))
    monkeypatch.setenv("SCO_SLURM__REST_TOKEN", "tok-rest")
    monkeypatch.setenv("SCO_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("SCO_TEMPORAL__ADDRESS", "127.0.0.1:1")
    monkeypatch.setenv("SCO_NATS_URL", "nats://sco:pw-in-dsn@127.0.0.1:1")
    for args in (["dev", "status"], ["dev", "status", "--json"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1  # nothing answers on port 1
        assert not [x for x in SECRETS if x in result.output], result.output
    rows = json.loads(CliRunner().invoke(app, ["dev", "status", "--json"]).output)
    assert any("***" in str(r) for r in rows)


def test_a_missing_secret_file_is_named(tmp_path: Path) -> None:
    s = Settings(postgres={"password_file": tmp_path / "nope"})
    with pytest.raises(SecretFileError, match=r"postgres.password_file: .*/nope: No such file"):
        postgres_conninfo(s)


def test_tls_settings_are_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCO_TEMPORAL__TLS__ENABLED", "true")
    monkeypatch.setenv("SCO_TEMPORAL__TLS__CLIENT_CERT_FILE", "/c.pem")
    with pytest.raises(SettingsError, match=r"temporal\.tls: Value error, client_cert_file and"):
        load_settings()


def test_nats_credentials_come_from_files(tmp_path: Path) -> None:
    """The per-role NATS users (`sco nats-users`) reach `nats.connect`: the password read
    from its file when the client is made; a creds or nkey file passed as a path."""
    from workers.client_security import nats_options

    (tmp_path / "control-r1.password").write_text("pw-nats\n")
    s = Settings(
        nats_auth={"user": "control-r1", "password_file": tmp_path / "control-r1.password"}
    )
    assert nats_options(s) == {
        "user": "control-r1",
        "password": "pw-nats",
        "inbox_prefix": "_INBOX_SCO.control-r1",  # replies only where its user may read
    }
    assert "pw-nats" not in repr(s) and "pw-nats" not in s.model_dump_json()
    (tmp_path / "sco.creds").write_text("-----BEGIN NATS USER JWT-----\n")
    creds = Settings(nats_auth={"creds_file": tmp_path / "sco.creds"})
    assert nats_options(creds) == {"user_credentials": str(tmp_path / "sco.creds")}
    (tmp_path / "token").write_text("tok-nats\n")
    assert nats_options(Settings(nats_auth={"token_file": tmp_path / "token"})) == {
        "token": "tok-nats"
    }
    with pytest.raises(SecretFileError, match=r"nats_auth.password_file: .*/nope"):
        nats_options(Settings(nats_auth={"user": "u", "password_file": tmp_path / "nope"}))


@pytest.mark.parametrize(
    ("auth", "error"),
    [
        ({"user": "control-r1"}, "user needs nats_auth.password_file or a client certificate"),
        ({"creds_file": "/x", "token_file": "/y"}, "one NATS credential at a time"),
    ],
)
def test_nats_credentials_are_one_way_in(auth: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Settings(nats_auth=auth)


def test_a_nats_user_named_by_its_client_certificate_needs_no_password(tmp_path: Path) -> None:
    """The secure box maps each certificate to its user (verify_and_map): the user names
    the identity's inbox, and no password is sent."""
    cert, key = tmp_path / "c.crt", tmp_path / "c.key"
    s = Settings(
        nats_auth={"user": "control-r1"},
        nats_tls={"enabled": True, "client_cert_file": cert, "client_key_file": key},
    )
    assert s.nats_auth.user == "control-r1" and s.nats_auth.password_file is None
