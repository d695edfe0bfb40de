"""Credentials masked out of anything SCO prints or logs: the one function for it.

A DSN or URL may carry a password (`postgresql://sco:pw@db/sco`, `http://u:pw@ch:8123`),
a NATS token (`nats://TOKEN@host`), or a password in a key=value connection string
(`host=a,b password=pw`) or a query (`?password=pw`). `mask_credentials` replaces each
secret with `***` wherever it occurs in a text: a bare DSN, a comma-separated server list,
a log line, an exception message. It lives in `contracts` so the control plane (settings,
`sco dev status`, every process's log) and the node agent use the same function; the log
formatter of both (contracts/logformat.py) applies it to every line it writes.

Standard library only.
"""

from __future__ import annotations

import re

MASK = "***"

#: `scheme://user:password@` — the password is everything up to the last `@` of the
#: authority (a password may hold `@`-free punctuation; an unescaped `/` ends the authority).
_URL_USER_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@,'\"]*:)[^\s/,'\"]*@")

#: `nats://TOKEN@host` (and tls://, ws://, wss://): a user with no password is a token.
_NATS_TOKEN = re.compile(r"(?P<head>\b(?:nats|tls|ws|wss)://)[^\s:/@,'\"]+@")

#: `password=...` in a key=value connection string or a URL query; quoted values whole.
_KEY_VALUE_SECRET = re.compile(
    r"(?P<head>\b(?:password|passwd|pass|sslpassword|token|secret|access_key|secret_key"
    r"|api_key|apikey|sasl\.password)\s*=\s*)(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&;,'\"]+)",
    re.IGNORECASE,
)


def mask_credentials(text: str) -> str:
    """`text` with every credential of a DSN or URL in it replaced by `***`.

    User names and hosts stay (they say which account and server); passwords, NATS tokens
    and `password=`/`token=` values go. Idempotent: a masked text masks to itself."""
    if not text:
        return text
    out = _URL_USER_PASSWORD.sub(rf"\g<head>{MASK}@", text)
    out = _NATS_TOKEN.sub(
        lambda m: m.group(0) if m.group(0).endswith(f"{MASK}@") else f"{m['head']}{MASK}@", out
    )
    return _KEY_VALUE_SECRET.sub(rf"\g<head>{MASK}", out)


def has_credentials(text: str) -> bool:
    """Whether `text` holds a credential `mask_credentials` would mask."""
    return mask_credentials(text) != text
