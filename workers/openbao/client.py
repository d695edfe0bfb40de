"""A narrow client of the OpenBao HTTP API: the few calls SCO makes, typed errors.

Contract of every call:
- `BaoUnavailable`: nothing answered (refused, timed out, TLS failed); retrying may help.
- `BaoSealed`: the server answered 503 because it is sealed; unseal, then retry.
- `BaoRequestError`: the server refused the request (4xx/5xx); `status` and OpenBao's own
  error list say why. Not retried here: the caller's input or the server's state is wrong.
- `read` answers None for a path that holds nothing (404), never raises for it.

Standard library only (urllib), so a process that only reads a secret or has a
certificate issued pulls in nothing new. The token is read from a file the caller names and
is never logged, nor part of any error message.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: One request's limit. Generating a CA key is the slowest call SCO makes (EC: well under
#: a second); anything beyond this is a server in trouble.
DEFAULT_TIMEOUT_S = 15.0


class BaoError(RuntimeError):
    """Any failure talking to OpenBao; the message is one line naming the path and why."""


class BaoUnavailable(BaoError):
    """Nothing answered at the address (or its TLS did not verify)."""


class BaoSealed(BaoError):
    """The server is sealed: it answers only sys/seal-status, sys/unseal and sys/init."""


class BaoRequestError(BaoError):
    """The server answered with an error status."""

    def __init__(self, method: str, path: str, status: int, errors: list[str]) -> None:
        self.status = status
        self.errors = errors
        reason = "; ".join(e.replace("\n", " ").strip() for e in errors) or "no reason given"
        super().__init__(f"{method} {path}: HTTP {status}: {reason}")


def is_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, BaoUnavailable)


def is_sealed(exc: BaseException) -> bool:
    return isinstance(exc, BaoSealed)


def is_permission_denied(exc: BaseException) -> bool:
    return isinstance(exc, BaoRequestError) and exc.status == 403


@dataclass(frozen=True)
class SealStatus:
    initialized: bool
    sealed: bool
    version: str


@dataclass(frozen=True)
class InitResult:
    unseal_key: str  # hex, the one share (threshold 1)
    root_token: str


class BaoClient:
    """Calls on one server. `token` is sent on every call but the sys/ seal calls."""

    def __init__(
        self,
        address: str,
        *,
        token: str = "",
        ca_file: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.address = address.rstrip("/")
        self.token = token
        self._timeout = timeout
        self._tls: ssl.SSLContext | None = None
        if self.address.startswith("https://"):
            try:
                self._tls = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            except (OSError, ssl.SSLError) as exc:
                raise BaoError(f"{ca_file}: cannot load the CA: {exc.strerror or exc}") from None

    @classmethod
    def from_files(
        cls, address: str, *, token_file: Path | None, ca_file: Path | None
    ) -> BaoClient:
        token = ""
        if token_file is not None:
            try:
                token = token_file.read_text().strip()
            except OSError as exc:
                raise BaoError(f"{token_file}: cannot read the token: {exc.strerror}") from exc
        return cls(address, token=token, ca_file=ca_file)

    # -- the seal ---------------------------------------------------------------------------

    def seal_status(self) -> SealStatus:
        doc = self._call("GET", "sys/seal-status", None, token=False)
        return SealStatus(
            initialized=bool(doc.get("initialized")),
            sealed=bool(doc.get("sealed")),
            version=str(doc.get("version", "")),
        )

    def init(self) -> InitResult:
        """Initialise with one key share (a box's server; production keeps several)."""
        doc = self._call(
            "PUT", "sys/init", {"secret_shares": 1, "secret_threshold": 1}, token=False
        )
        return InitResult(unseal_key=str(doc["keys"][0]), root_token=str(doc["root_token"]))

    def unseal(self, key: str) -> SealStatus:
        doc = self._call("PUT", "sys/unseal", {"key": key}, token=False)
        return SealStatus(bool(doc.get("initialized")), bool(doc.get("sealed")), "")

    def active(self) -> bool:
        """Unsealed and serving requests (sys/health answers 200 only then)."""
        try:
            self._call("GET", "sys/health", None, token=False)
        except BaoError:
            return False
        return True

    # -- logical paths ----------------------------------------------------------------------

    def read(self, path: str) -> dict[str, Any] | None:
        """The `data` of a path; None when nothing is there."""
        try:
            doc = self._call("GET", path, None)
        except BaoRequestError as exc:
            if exc.status == 404:
                return None
            raise
        data = doc.get("data")
        return data if isinstance(data, dict) else None

    def write(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT `body`; the response's `data` ({} when the server answers 204)."""
        doc = self._call("PUT", path, body)
        data = doc.get("data")
        return data if isinstance(data, dict) else {}

    def read_raw(self, path: str) -> bytes:
        """A path whose answer is not JSON (a CRL's PEM: `<pki>/crl/pem`)."""
        return self._call_raw("GET", path, None, token=True)

    def list_keys(self, path: str) -> list[str]:
        """The keys under a path; [] when there are none."""
        try:
            doc = self._call("LIST", path, None)
        except BaoRequestError as exc:
            if exc.status == 404:
                return []
            raise
        keys = (doc.get("data") or {}).get("keys") or []
        return [str(k) for k in keys]

    def mounts(self) -> dict[str, dict[str, Any]]:
        """Secrets engines by path ("pki/" → its type, options, config)."""
        doc = self._call("GET", "sys/mounts", None)
        data = doc.get("data", doc)
        return {k: v for k, v in data.items() if isinstance(v, dict) and "type" in v}

    def create_token(self, policies: list[str], ttl: str = "1h") -> str:
        """A child token with only `policies` (and OpenBao's `default`): what an auth method
        would hand a process with those policies."""
        doc = self._call("PUT", "auth/token/create", {"policies": policies, "ttl": ttl})
        return str((doc.get("auth") or {})["client_token"])

    def approle_login(self, role_id: str, secret_id: str, mount: str = "approle") -> str:
        """A node's login: its role id and (single-use) secret id for a token."""
        doc = self._call(
            "PUT", f"auth/{mount}/login", {"role_id": role_id, "secret_id": secret_id}, token=False
        )
        return str((doc.get("auth") or {})["client_token"])

    def policy(self, name: str) -> str | None:
        data = self.read(f"sys/policies/acl/{name}")
        return str(data["policy"]) if data and "policy" in data else None

    # -- transport --------------------------------------------------------------------------

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None, *, token: bool = True
    ) -> dict[str, Any]:
        raw = self._call_raw(method, path, body, token=token)
        if not raw:
            return {}
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError:
            raise BaoError(f"{method} {path}: the answer is not JSON") from None
        return doc if isinstance(doc, dict) else {}

    def _call_raw(
        self, method: str, path: str, body: dict[str, Any] | None, *, token: bool
    ) -> bytes:
        url = f"{self.address}/v1/{path}"
        headers = {"Content-Type": "application/json"}
        if token and self.token:
            headers["X-Vault-Token"] = self.token
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self._timeout, context=self._tls) as resp:
                raw: bytes = resp.read()
        except urllib.error.HTTPError as exc:
            errors = _errors(exc.read())
            if exc.code == 503 and any("sealed" in e for e in errors):
                raise BaoSealed(f"{method} {path}: {self.address} is sealed") from None
            raise BaoRequestError(method, path, exc.code, errors) from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise BaoUnavailable(f"{self.address}: no answer ({reason})") from None
        return raw


def _errors(raw: bytes) -> list[str]:
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return [raw.decode(errors="replace")[:200]] if raw else []
    errors = doc.get("errors") if isinstance(doc, dict) else None
    return [str(e) for e in errors] if isinstance(errors, list) else []
