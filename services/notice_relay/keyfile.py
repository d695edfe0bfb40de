"""The relay's signing key, read again when its file changes: a rotation needs no restart.

The relay of each hall signs with its own key (`notices.hall_key_files`, else
`notices.signing_key_file`). To rotate, the new private key replaces the file (an atomic
rename, or a Kubernetes Secret update, whose symlink swap changes what the path opens):
the relay notices before its next signature (one stat per notice) or on SIGHUP, and signs
with the new key from then on. A file that does not read as a key is refused loudly and
the key in hand keeps signing: a botched rotation never leaves a hall unable to notice.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from nacl.signing import SigningKey
from prometheus_client import Counter

from contracts.keys import KeyFileError, key_id, load_signing_key

log = logging.getLogger(__name__)

KEY_RELOADS = Counter(
    "sco_notice_relay_key_reloads",
    "Signing key files read again after a change or SIGHUP, by result (loaded, refused)",
    ["region", "hall", "result"],
)

_Stamp = tuple[int, int, int, int] | None


def _stamp(path: Path) -> _Stamp:
    """What changes when the file is replaced or rewritten (None: it cannot be stat'ed)."""
    try:
        st = os.stat(path)  # follows symlinks: a Secret's ..data swap is a change
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class KeyFileSigner:
    """The signing key of `path`, re-read when the file changes (`current`) or when asked
    (`reload`, what SIGHUP does). Raises KeyFileError at construction only."""

    def __init__(self, path: Path, *, region: str = "", hall: str = "") -> None:
        self.path = path
        self._labels = (region, hall)
        self._stamp = _stamp(path)
        self._key = load_signing_key(path)
        for result in ("loaded", "refused"):
            KEY_RELOADS.labels(region, hall, result)  # every series from the start, at zero

    @property
    def key_id(self) -> str:
        return key_id(self._key.verify_key)

    def current(self) -> SigningKey:
        """The key to sign with now: the file's, read again if it changed since."""
        stamp = _stamp(self.path)
        if stamp != self._stamp:
            self._load(stamp)
        return self._key

    def reload(self) -> None:
        """Read the file again whatever its stamp says."""
        self._load(_stamp(self.path))

    def _load(self, stamp: _Stamp) -> None:
        # The stamp is taken whatever happens: a refused file is not re-read (and logged)
        # for every notice, only once it changes again.
        self._stamp = stamp
        try:
            key = load_signing_key(self.path)
        except KeyFileError as exc:
            KEY_RELOADS.labels(*self._labels, "refused").inc()
            log.error(
                "signing key file %s refused (%s); still signing with key %s",
                self.path,
                exc,
                self.key_id,
            )
            return
        KEY_RELOADS.labels(*self._labels, "loaded").inc()
        before = self.key_id
        self._key = key
        if self.key_id != before:
            log.warning("signing key of %s/%s: now %s (was %s)", *self._labels, self.key_id, before)
