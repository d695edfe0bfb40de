"""docs/reference.md is generated from the code (`sco docs reference`, workers/cli/
reference.py) and must equal what the code gives now: a changed option, help text or
settings key fails here until `make docs` is run and the file committed."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.paths import REPO
from workers.cli import reference
from workers.cli.main import COMMANDS, app
from workers.settings import Settings

REFERENCE = REPO / "docs" / "reference.md"
runner = CliRunner()


def test_committed_reference_is_what_the_code_generates() -> None:
    drift = reference.drift_report(REFERENCE, reference.render())
    assert drift == "", drift


def test_generation_is_deterministic_and_independent_of_the_terminal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first = reference.render()
    monkeypatch.setenv("COLUMNS", "37")
    monkeypatch.setenv("SCO_REGION", "r9")
    monkeypatch.setenv("SCO_CONTROL__TICK_SECONDS", "7")
    monkeypatch.chdir(tmp_path)
    assert reference.render() == first
    for machine in (str(REPO), str(Path.home()), str(tmp_path)):
        assert machine not in first


def test_every_command_and_settings_key_is_in_it() -> None:
    text = reference.render()
    for name in COMMANDS:
        assert f" sco {name}\n" in text, name
    for env in _env_vars(Settings, "SCO_"):
        assert f"`{env}`" in text, env


def _env_vars(model: type, prefix: str) -> list[str]:
    from pydantic import BaseModel

    found = []
    for name, info in model.model_fields.items():  # type: ignore[attr-defined]
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            found += _env_vars(ann, f"{prefix}{name.upper()}__")
        else:
            found.append(f"{prefix}{name.upper()}")
    return found


def test_check_exits_1_naming_the_drift(tmp_path: Path) -> None:
    stale = tmp_path / "reference.md"
    text = reference.render()
    stale.write_text(text.replace("Print the version and exit.", "Print it."))
    result = runner.invoke(app, ["docs", "reference", "--check", "--out", str(stale)])
    assert result.exit_code == 1
    assert "out of date with the code" in result.output
    assert "Sections that differ: sco\n" in result.output
    assert "-| `--version` | flag | `false` | Print it. |" in result.output

    current = tmp_path / "current.md"
    written = runner.invoke(app, ["docs", "reference", "--out", str(current)])
    assert written.exit_code == 0 and current.read_text() == text
    checked = runner.invoke(app, ["docs", "reference", "--check", "--out", str(current)])
    assert checked.exit_code == 0, checked.output


def test_check_of_a_missing_file_says_how_to_make_it(tmp_path: Path) -> None:
    result = runner.invoke(app, ["docs", "reference", "--check", "--out", str(tmp_path / "x.md")])
    assert result.exit_code == 1 and "missing; run `sco docs reference" in result.output


def test_every_command_with_json_output_documents_its_schema() -> None:
    """A command with `--json` says what it prints (workers/cli/json_out.py), and the
    reference shows it under the command; a schema names a command that exists."""
    from workers.cli.json_out import SCHEMAS

    root, ctx = reference._root()
    with_json = {
        " ".join(path)
        for path, cmd, _ in reference._walk(root, ctx, ("sco",))
        if any("--json" in getattr(p, "opts", ()) for p in cmd.params)
    }
    assert with_json == set(SCHEMAS)
    text = reference.render()
    for name, schema in SCHEMAS.items():
        assert schema.fields(), name
        section = text.split(f" {name}\n", 1)[1]
        assert schema.describe() in section.split("\n#", 1)[0], name
