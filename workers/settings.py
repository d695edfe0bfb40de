"""One typed settings model for every SCO control-plane process.

Sources, highest first: explicit overrides, `SCO_*` environment variables (nested with
`__`, e.g. `SCO_TEMPORAL__ADDRESS`), the TOML file named by `SCO_CONFIG` (default
`sco.toml` in the working directory, optional), then the defaults below, which are the
embedded local region in a box.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

CONFIG_ENV = "SCO_CONFIG"
DEFAULT_CONFIG_FILE = Path("sco.toml")


class TemporalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: str = "127.0.0.1:7233"
    ui_port: int = 8233
    # Each region has its own namespace so regions share nothing on the control path.
    namespace_prefix: str = ""
    retention_days: int = Field(default=7, ge=1)

    def namespace(self, region: str) -> str:
        return f"{self.namespace_prefix}{region}"

    def task_queue(self, region: str) -> str:
        return f"sco-{region}"


class KafkaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bootstrap_servers: str = "127.0.0.1:19092"
    partitions: int = Field(default=6, ge=1)
    replication_factor: int = Field(default=1, ge=1)


class ProviderSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # simulator: the simulated cloud service (`sco sim serve`), the embedded default.
    # openstack: the region's OpenStack through openstacksdk (clouds.yaml, OS_CLOUD, OS_*).
    kind: Literal["simulator", "openstack"] = "simulator"
    openstack_cloud: str = "sco-testcloud"  # the clouds.yaml entry of this region
    image: str = "sco-image"
    network: str = "none"


class OutboxSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(default=2000, ge=1)
    # The relay wakes on NOTIFY; this is only the safety net for a lost notification.
    idle_poll_seconds: float = Field(default=1.0, gt=0)
    # Sent rows are kept this long (for audits and re-publishing), then deleted by the relay.
    retention_hours: float = Field(default=24.0, ge=0)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SCO_",
        env_nested_delimiter="__",
        extra="forbid",
    )

    region: str = "r1"
    regions: list[str] = ["r1", "r2", "r3"]
    regions_dir: Path = Path("deploy/regions")
    data_dir: Path = Path(".sco")
    postgres_dsn: str = "postgresql://postgres@127.0.0.1:5432/sco"
    nats_url: str = "nats://127.0.0.1:4222"
    # Empty means "<data_dir>/ledger" on the embedded chDB backend.
    ledger_dsn: str = ""
    temporal: TemporalSettings = TemporalSettings()
    kafka: KafkaSettings = KafkaSettings()
    outbox: OutboxSettings = OutboxSettings()
    provider: ProviderSettings = ProviderSettings()

    @property
    def effective_ledger_dsn(self) -> str:
        return self.ledger_dsn or f"chdb://{(self.data_dir / 'ledger').resolve()}"

    def region_file(self, region: str | None = None) -> Path:
        return self.regions_dir / f"{region or self.region}.toml"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = TomlConfigSettingsSource(settings_cls, toml_file=config_file())
        return (init_settings, env_settings, toml)


class SettingsError(ValueError):
    """Settings could not be loaded; the message names the source, field and reason."""


def config_file() -> Path:
    return Path(os.environ.get(CONFIG_ENV, str(DEFAULT_CONFIG_FILE)))


def load_settings(**overrides: Any) -> Settings:
    path = config_file()
    if CONFIG_ENV in os.environ and not path.is_file():
        raise SettingsError(f"{path}: {CONFIG_ENV} names a file that does not exist")
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "(root)"
            lines.append(f"{path} or SCO_* environment: {field}: {err['msg']}")
        raise SettingsError("\n".join(lines)) from exc
    except ValueError as exc:  # TOML syntax errors surface as ValueError subclasses
        raise SettingsError(f"{path}: {exc}") from exc
