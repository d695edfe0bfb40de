"""`sco keys relay-new | relay-retire | relay-list`: a hall's relay key made, listed and
retired in the notice keys directory, which then compiles into a hall-scoped bundle; bad
input is one line and writes nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contracts import bundle, keys
from tests.support.paths import EXAMPLES, REPO
from workers.cli.main import app

pytestmark = pytest.mark.timeout(30)
runner = CliRunner()


def sco(tmp: Path, *argv: str) -> tuple[int, str, str]:
    env = {
        "SCO_REGIONS_DIR": str(REPO / "deploy" / "regions"),
        "SCO_REGION": "r1",
        "SCO_DATA_DIR": str(tmp / "data"),
        "SCO_CONTRACTS__NOTICE_KEYS_DIR": str(tmp / "notice-keys"),
    }
    res = runner.invoke(app, list(argv), env=env)
    return res.exit_code, res.stdout, res.stderr


def test_make_list_retire_and_compile_a_hall_scoped_region(tmp_path: Path) -> None:
    made = {}
    for hall in "ABCD":
        code, out, err = sco(
            tmp_path,
            "keys",
            "relay-new",
            "--hall",
            hall,
            "--out",
            str(tmp_path / "secrets"),
            "--json",
        )
        assert code == 0, err
        made[hall] = json.loads(out)
        assert made[hall]["still_signing"] == []
    private = Path(made["A"]["private"])
    assert private.parent == tmp_path / "secrets" and private.stat().st_mode & 0o077 == 0
    assert Path(made["A"]["public"]).parent == tmp_path / "notice-keys" / "r1"
    assert not list((tmp_path / "notice-keys").rglob("*.key"))  # no secret beside the .pubs

    # Rotation: hall A's next key names the one still signing.
    code, out, err = sco(
        tmp_path, "keys", "relay-new", "--hall", "A", "--out", str(tmp_path / "secrets")
    )
    assert code == 0, err
    assert f"relay-retire --region r1 --key {made['A']['key_id']}" in out
    before = datetime.now(UTC)
    code, out, err = sco(tmp_path, "keys", "relay-retire", "--key", made["A"]["key_id"], "--json")
    assert code == 0, err
    not_after = datetime.fromisoformat(json.loads(out)["not_after"])
    lead_and_margin = timedelta(seconds=120 + 30)  # r1's notice lead + the skew margin
    assert before + lead_and_margin <= not_after <= datetime.now(UTC) + lead_and_margin

    code, out, err = sco(tmp_path, "keys", "relay-list", "--json")
    assert code == 0, err
    listed = {row["key_id"]: row for row in json.loads(out)["keys"]}
    assert listed[made["A"]["key_id"]]["halls"] == "A"
    assert listed[made["A"]["key_id"]]["not_after"] == not_after.isoformat()
    assert listed[made["B"]["key_id"]] == {
        "key_id": made["B"]["key_id"],
        "halls": "B",
        "not_after": "",
        "revoked": False,
    }

    # What compile makes of it (r2 and r3 keep one region-wide key each).
    for other in ("r2", "r3"):
        keys.generate(tmp_path / "notice-keys" / other)
    _, signer, _ = keys.generate(tmp_path / "signer")
    code, out, err = sco(
        tmp_path,
        "contracts",
        "compile",
        str(EXAMPLES),
        "--regions",
        str(REPO / "deploy" / "regions"),
        "--key",
        str(signer),
        "--notice-keys",
        str(tmp_path / "notice-keys"),
        "--out",
        str(tmp_path / "bundle.json"),
    )
    assert code == 0, err
    verified = bundle.verify(
        (tmp_path / "bundle.json").read_bytes(), keys.TrustStore.load(tmp_path / "signer")
    )
    policy = verified.content.notice_policy("r1")
    assert policy is not None and len(policy.scopes) == 5
    assert policy.scopes[made["A"]["key_id"]].not_after == not_after


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["relay-new", "--hall", "Z", "--out", "{tmp}/s"],
            "--hall 'Z': region r1 has halls A, B, C, D",
        ),
        (["relay-retire", "--key", "0123456789abcdef"], "no such directory"),
        (["relay-retire", "--key", "bad key!"], "--key"),
        (["relay-list", "--region", "r9"], "unknown region r9"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    code, _, err = sco(tmp_path, "keys", *[a.format(tmp=tmp_path) for a in argv])
    assert code == 1 and message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "notice-keys").exists() and not (tmp_path / "s").exists()


def test_retiring_a_key_the_scopes_do_not_name_is_refused(tmp_path: Path) -> None:
    code, _, err = sco(tmp_path, "keys", "relay-new", "--hall", "B", "--out", str(tmp_path / "s"))
    assert code == 0, err
    scopes = (tmp_path / "notice-keys" / "r1" / "scopes.yaml").read_text()
    code, _, err = sco(tmp_path, "keys", "relay-retire", "--key", "0123456789abcdef")
    assert code == 1 and "key 0123456789abcdef has no entry to retire" in err, err
    assert (tmp_path / "notice-keys" / "r1" / "scopes.yaml").read_text() == scopes


def test_a_broken_scopes_file_is_named_and_no_key_is_made(tmp_path: Path) -> None:
    region_dir = tmp_path / "notice-keys" / "r1"
    region_dir.mkdir(parents=True)
    (region_dir / "scopes.yaml").write_text("0123456789abcdef: {halls: [A], when: soon}\n")
    code, _, err = sco(tmp_path, "keys", "relay-new", "--hall", "A", "--out", str(tmp_path / "s"))
    assert code == 1 and "scopes.yaml: 0123456789abcdef.when: extra field not permitted" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists() and not list(region_dir.glob("*.pub"))
