"""A signed bundle with two contracts that checkpoint to RGW, and its trust directory."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from contracts import bundle, keys
from contracts.model import Contract
from tests.support.contract_fixtures import example


def two_checkpointing_contracts() -> list[Contract]:
    train = example("llm-train")
    tune = example("llm-train")
    tune.update(name="llm-tune", floor={}, tier=2)
    tune["selectors"] = {"slurm": [{"account": "tune", "partition": "spot"}]}
    tune["drain"]["checkpoint_uri"] = "s3://tune-ckpt/runs"
    return [Contract.model_validate(c, strict=False) for c in (train, tune)]


def signed_bundle(directory: Path) -> tuple[Path, Path]:
    """(bundle file, trust directory)."""
    trust = directory / "keys"
    _, key_path, _ = keys.generate(trust)
    raw = bundle.build(
        two_checkpointing_contracts(),
        serial=1,
        created_at=datetime.now(UTC),
        key=keys.load_signing_key(key_path),
    )
    path = directory / "bundle.json"
    path.write_bytes(raw)
    return path, trust
