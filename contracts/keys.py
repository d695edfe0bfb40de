"""Ed25519 signing keys and the trust directory.

`<key id>.key` holds a private key (hex seed, mode 0600), `<key id>.pub` its public key
(hex). A directory of `.pub` files is a trust directory; `revoked.txt` in it lists key ids
(one per line, `#` comments) that are refused even when their `.pub` is still there.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from nacl.encoding import HexEncoder
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

REVOKED_FILE = "revoked.txt"


class KeyFileError(ValueError):
    """A key file, or the trust directory, is missing or malformed."""


class SignatureRefused(ValueError):
    """A signature the trust directory does not accept; str() names the key and why."""


def key_id(verify_key: VerifyKey) -> str:
    return hashlib.sha256(bytes(verify_key)).hexdigest()[:16]


def generate(out_dir: Path) -> tuple[str, Path, Path]:
    """Write a new key pair; return (key id, private key path, public key path)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    signing = SigningKey.generate()
    kid = key_id(signing.verify_key)
    private, public = out_dir / f"{kid}.key", out_dir / f"{kid}.pub"
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(signing.encode(HexEncoder) + b"\n")
    public.write_bytes(signing.verify_key.encode(HexEncoder) + b"\n")
    return kid, private, public


def load_signing_key(path: Path) -> SigningKey:
    try:
        return SigningKey(path.read_bytes().strip(), encoder=HexEncoder)
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read private key: {exc.strerror}") from exc
    except Exception as exc:  # nacl raises several types for malformed keys
        raise KeyFileError(f"{path}: not an Ed25519 private key (hex seed expected)") from exc


@dataclass(frozen=True)
class TrustStore:
    keys: dict[str, VerifyKey]
    revoked: frozenset[str]

    @classmethod
    def load(cls, directory: Path) -> TrustStore:
        if not directory.is_dir():
            raise KeyFileError(f"{directory}: trust directory does not exist")
        keys = {}
        for pub in sorted(directory.glob("*.pub")):
            try:
                vk = VerifyKey(pub.read_bytes().strip(), encoder=HexEncoder)
            except Exception as exc:  # nacl raises several types for malformed keys
                raise KeyFileError(f"{pub}: not an Ed25519 public key (hex expected)") from exc
            if key_id(vk) != pub.stem:
                raise KeyFileError(f"{pub}: file name does not match its key id {key_id(vk)}")
            keys[pub.stem] = vk
        revoked_path = directory / REVOKED_FILE
        revoked: set[str] = set()
        if revoked_path.is_file():
            for line in revoked_path.read_text().splitlines():
                entry = line.split("#", 1)[0].strip()
                if entry:
                    revoked.add(entry)
        return cls(keys, frozenset(revoked))

    def check(self, kid: str, signed: bytes, signature_hex: str) -> None:
        """`signature_hex` is `kid`'s signature over `signed`, and `kid` a trusted key not
        revoked; SignatureRefused otherwise."""
        if kid in self.revoked:
            raise SignatureRefused(f"signed with revoked key {kid}")
        verify_key = self.keys.get(kid)
        if verify_key is None:
            raise SignatureRefused(f"signed with unknown key {kid}")
        try:
            verify_key.verify(signed, bytes.fromhex(signature_hex))
        except (BadSignatureError, ValueError) as exc:
            raise SignatureRefused(f"bad signature for key {kid}") from exc
