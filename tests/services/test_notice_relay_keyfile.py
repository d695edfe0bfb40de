"""The relay's key file is read again when it changes or on SIGHUP: a rotation needs no
relay restart, and a botched file never leaves the hall unable to sign."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from nacl.encoding import HexEncoder
from nacl.signing import SigningKey

from contracts.keys import KeyFileError, key_id
from services.notice_relay.keyfile import KEY_RELOADS, KeyFileSigner
from services.notice_relay.service import _reload_on_hangup
from tests.support.wait import checked, eventually_async

pytestmark = pytest.mark.timeout(20)


def install(path: Path, key: SigningKey) -> None:
    """What an operator (or a Secret update) does: the new file renamed over the old."""
    tmp = path.with_suffix(".new")
    tmp.write_bytes(key.encode(HexEncoder) + b"\n")
    os.replace(tmp, path)


def reloads(result: str, hall: str) -> float:
    return float(KEY_RELOADS.labels("r1", hall, result)._value.get())


def test_a_replaced_key_file_signs_from_the_next_notice(tmp_path: Path) -> None:
    path = tmp_path / "hall-A.key"
    first, second = SigningKey.generate(), SigningKey.generate()
    install(path, first)
    signer = KeyFileSigner(path, region="r1", hall="A")
    assert signer.current() == first and signer.current() == first  # unchanged: no re-read
    assert reloads("loaded", "A") == 0
    install(path, second)
    assert signer.current() == second
    assert signer.key_id == key_id(second.verify_key)
    assert reloads("loaded", "A") == 1


def test_a_botched_key_file_is_refused_and_the_key_in_hand_keeps_signing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "hall-B.key"
    good = SigningKey.generate()
    install(path, good)
    signer = KeyFileSigner(path, region="r1", hall="B")
    path.with_suffix(".new").write_text("not a key\n")
    os.replace(path.with_suffix(".new"), path)
    assert signer.current() == good
    assert signer.current() == good  # refused once, not re-read for every notice
    assert reloads("refused", "B") == 1
    [line] = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert str(path) in line and key_id(good.verify_key) in line
    path.unlink()
    assert signer.current() == good  # gone altogether: still signing with what it has
    with pytest.raises(KeyFileError, match="cannot read private key"):
        KeyFileSigner(path)  # at start, though, a missing key is an error


async def test_sighup_reads_the_key_file_again(tmp_path: Path) -> None:
    path = tmp_path / "hall-C.key"
    install(path, SigningKey.generate())
    signer = KeyFileSigner(path, region="r1", hall="C")
    with _reload_on_hangup(signer):
        os.kill(os.getpid(), signal.SIGHUP)
        await eventually_async(
            checked(lambda: reloads("loaded", "C") == 1), timeout=5, what="the SIGHUP reload"
        )
