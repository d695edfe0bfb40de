from __future__ import annotations

from pathlib import Path

import pytest

from workers.settings import SettingsError, load_settings


def test_defaults_are_the_local_region_in_a_box(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    s = load_settings()
    assert s.region == "r1" and s.temporal.address == "127.0.0.1:7233"
    assert s.effective_ledger_dsn == f"chdb://{(tmp_path / '.sco' / 'ledger')}"
    assert s.temporal.namespace("r2") == "r2" and s.temporal.task_queue("r2") == "sco-r2"


def test_environment_wins_over_the_toml_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = tmp_path / "sco.toml"
    cfg.write_text('region = "r2"\n[temporal]\naddress = "t:1"\nretention_days = 3\n')
    monkeypatch.setenv("SCO_CONFIG", str(cfg))
    monkeypatch.setenv("SCO_TEMPORAL__ADDRESS", "env:2")
    s = load_settings()
    assert s.region == "r2" and s.temporal.address == "env:2" and s.temporal.retention_days == 3


def test_a_bad_value_names_the_file_the_field_and_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = tmp_path / "sco.toml"
    cfg.write_text("[kafka]\npartitions = 0\nbogus = 1\n")
    monkeypatch.setenv("SCO_CONFIG", str(cfg))
    with pytest.raises(SettingsError) as err:
        load_settings()
    text = str(err.value)
    assert str(cfg) in text
    assert "kafka.partitions: Input should be greater than or equal to 1" in text
    assert "kafka.bogus: Extra inputs are not permitted" in text


def test_a_missing_config_file_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SCO_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(SettingsError, match=r"nope\.toml: SCO_CONFIG names a file that does not"):
        load_settings()


def test_a_toml_syntax_error_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "sco.toml"
    cfg.write_text("region = \n")
    monkeypatch.setenv("SCO_CONFIG", str(cfg))
    with pytest.raises(SettingsError, match=r"sco\.toml"):
        load_settings()


def test_user_data_templates_may_only_name_their_placeholders(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = tmp_path / "sco.toml"
    cfg.write_text(
        '[slurm]\nuser_data = "hostname: {hostname}\\nrack: {rack}"\n'
        '[kubernetes]\nnode_user_data = "args: {kubelet_args} {"\n'
    )
    monkeypatch.setenv("SCO_CONFIG", str(cfg))
    with pytest.raises(SettingsError) as err:
        load_settings()
    text = str(err.value)
    assert "slurm.user_data: Value error, template placeholders may only be" in text
    assert "KeyError('rack')" in text
    assert "kubernetes.node_user_data: Value error" in text
    cfg.write_text('[slurm]\nuser_data = "a: {{literal}} b: {hostname} c: {slurmctld}"\n')
    assert load_settings().slurm.user_data.startswith("a: {{literal}}")


def test_the_environment_is_read_as_pydantic_settings_read_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Decision 0035: no pydantic-settings, the same reading. Names are case-insensitive,
    `__` goes into sections and tables (merged with a JSON value of the same section),
    lists and tables are JSON, variables naming no field are not settings, and overrides
    win over the environment, which wins over the file, key by key."""
    cfg = tmp_path / "sco.toml"
    cfg.write_text(
        '[temporal]\naddress = "toml:1"\nnamespace_prefix = "tp-"\n'
        '[notices.hall_key_files]\nB = "/k/b.key"\n'
    )
    monkeypatch.setenv("SCO_CONFIG", str(cfg))
    monkeypatch.setenv("sco_region", "r2")
    monkeypatch.setenv("SCO_REGIONS", '["r1", "r2"]')
    monkeypatch.setenv("SCO_TEMPORAL", '{"ui_port": 1}')
    monkeypatch.setenv("SCO_TEMPORAL__TLS__ENABLED", "true")
    monkeypatch.setenv("SCO_NOTICES__HALL_KEY_FILES__A", "/k/a.key")
    monkeypatch.setenv("SCO_CONTRACTS__MIRROR_URLS", '["m1"]')
    monkeypatch.setenv("SCO_ESTATE__REGIONS__R2__POSTGRES_DSN", "postgresql://h/db")
    monkeypatch.setenv("SCO_PYTHON", "not a setting")
    s = load_settings(temporal={"retention_days": 3})
    assert s.region == "r2" and s.regions == ["r1", "r2"]
    t = s.temporal
    assert (t.address, t.namespace_prefix, t.ui_port, t.tls.enabled, t.retention_days) == (
        "toml:1",
        "tp-",
        1,
        True,
        3,
    )
    # Table keys from the environment are lower case, as pydantic-settings made them.
    assert s.notices.hall_key_files == {"B": Path("/k/b.key"), "a": Path("/k/a.key")}
    assert s.contracts.mirror_urls == ["m1"]
    assert s.estate.regions["r2"].postgres_dsn == "postgresql://h/db"


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("SCO_REGIONS", "r1,r2", "environment SCO_REGIONS: not valid JSON"),
        ("SCO_CONTRACTS__MIRROR_URLS", "m1", "environment SCO_CONTRACTS__MIRROR_URLS: not valid"),
        ("SCO_TEMPORAL__BOGUS", "1", "temporal.bogus: Extra inputs are not permitted"),
        ("SCO_WORKER__METRICS_PORT", "x", "worker.metrics_port: Input should be a valid integer"),
    ],
)
def test_a_bad_environment_value_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, value: str, reason: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=reason):
        load_settings()
