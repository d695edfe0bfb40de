"""The agent's config read without pydantic (decision 0041): every value as TOML or the
environment gives it, each refusal one line naming the file (or env key), field and reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import AgentConfig, ConfigError, load_config

pytestmark = pytest.mark.timeout(30)

BASE = 'region = "r1"\nhall = "D"\nnode_id = "n1"\n'


def config_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(BASE + extra)
    return path


def test_environment_strings_become_each_fields_type(tmp_path: Path) -> None:
    config = load_config(
        config_file(tmp_path),
        {
            "SCO_AGENT_WORKERS": "4",
            "SCO_AGENT_SAFETY_MARGIN_SECONDS": "2.5",
            "SCO_AGENT_DRY_RUN": "yes",
            "SCO_AGENT_SLURM_CGROUP_CHECK": "off",
            "SCO_AGENT_METADATA_PATH": "/run/meta.json",
            "SCO_AGENT_SCHEDULER": "kubernetes",
            "SCO_AGENT_NATS_URLS": "tls://a:4222,,tls://b:4222 ",
        },
    )
    assert config.workers == 4 and isinstance(config.workers, int)
    assert config.safety_margin_seconds == 2.5
    assert config.dry_run is True and config.slurm_cgroup_check is False
    assert config.metadata_path == Path("/run/meta.json")
    assert config.scheduler == "kubernetes"
    assert config.nats_urls == ["tls://a:4222", "tls://b:4222"]
    assert config.journal_path == Path("/var/lib/sco-agent/journal.jsonl")  # default


def test_toml_values_keep_their_types(tmp_path: Path) -> None:
    config = load_config(
        config_file(
            tmp_path, "workers = 3\nbundle_max_age_hours = 2\nnotice_lead_seconds = 60.0\n"
        ),
        {},
    )
    assert (config.workers, config.bundle_max_age_hours, config.notice_lead_seconds) == (3, 2, 60)
    assert isinstance(config.bundle_max_age_hours, float)
    assert isinstance(config.notice_lead_seconds, int)


@pytest.mark.parametrize(
    ("extra", "env", "where", "field", "why"),
    [
        ("workers = 0\n", {}, "", "workers", "must be at least 1, got 0"),
        ("workers = 17\n", {}, "", "workers", "must be at most 16, got 17"),
        ("workers = 2.5\n", {}, "", "workers", "expected an integer, got 2.5"),
        ("workers = true\n", {}, "", "workers", "expected a number, got bool"),
        ("", {"SCO_AGENT_WORKERS": "lots"}, "env SCO_AGENT_WORKERS", "workers", "an integer"),
        ("report_timeout_seconds = 0\n", {}, "", "report_timeout_seconds", "greater than 0"),
        ("", {"SCO_AGENT_CLOCK_CHECK_SECONDS": "nan"}, "env", "clock_check_seconds", "finite"),
        ("", {"SCO_AGENT_CLOCK_CHECK_SECONDS": "inf"}, "env", "clock_check_seconds", "finite"),
        ("dry_run = \"maybe\"\n", {}, "", "dry_run", "expected true or false"),
        ("scheduler = \"pbs\"\n", {}, "", "scheduler", "expected one of 'slurm', 'kubernetes'"),
        ("nats_urls = [1]\n", {}, "", "nats_urls", "expected a list of strings"),
        ("cache_dir = 5\n", {}, "", "cache_dir", "expected a path"),
        ("nats_user = 5\n", {}, "", "nats_user", "expected a string, got int"),
        ("safety_margin = 3\n", {}, "", "safety_margin", "unknown key"),
        ("", {"SCO_AGENT_HALL": "D.>"}, "env SCO_AGENT_HALL", "hall", "NATS subject token"),
        ("nats_tls_cert = \"/c\"\n", {}, "", "-", "nats_tls_cert and nats_tls_key go together"),
    ],
)  # fmt: skip
def test_a_bad_value_is_one_line_naming_where_field_and_reason(
    tmp_path: Path, extra: str, env: dict[str, str], where: str, field: str, why: str
) -> None:
    path = config_file(tmp_path, extra)
    with pytest.raises(ConfigError) as err:
        load_config(path, env)
    text = str(err.value)
    assert err.value.field == field and why in text and str(path) in text, text
    assert where in err.value.source and "\n" not in text


def test_a_required_key_and_an_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('hall = "D"\n')
    with pytest.raises(ConfigError, match="region: field required"):
        load_config(path, {})
    path.write_bytes(b'region = "r\xff"\n')
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(path, {})
    with pytest.raises(ConfigError, match="file does not exist"):
        load_config(tmp_path / "none.toml", {})


def test_a_config_is_frozen_and_replace_makes_a_new_one(tmp_path: Path) -> None:
    config = AgentConfig.from_mapping({"region": "r1", "hall": "D", "node_id": "n1"})
    with pytest.raises(AttributeError):
        config.workers = 3  # type: ignore[misc]
    assert config.replace(workers=3).workers == 3 and config.workers == 2
