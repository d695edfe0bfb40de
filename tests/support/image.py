"""The SCO image as this tree builds it, once per test session.

Its tag is the build id (the package version), which does not change with the code or
the lock: an image left from an earlier checkout would carry old code and old
dependencies under the same tag. So the image tests never trust what is there; they run
`make image` once (podman's layer cache makes an unchanged tree a quick rebuild), or,
under `make test`, take the build it started beside the suite (tests/support/prep.py): two
builds at once share setuptools' build/ directory and one fails."""

from __future__ import annotations

import os
import subprocess

from tests.support import prep
from tests.support.paths import REPO
from workers.settings import WorkerSettings

IMAGE = f"registry.sco.internal/sco/sco:{WorkerSettings().effective_build_id()}"
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / "deploy" / "image" / "containers.conf")}

_built: list[str] = []


def current_image() -> str:
    """`make image` of this tree (once per session); the image's tag."""
    if not _built and prep.ran("image"):
        prep.await_prep("image")
        failed = prep.outcome("image")
        assert failed is None, failed
        _built.append(IMAGE)
    if not _built:
        made = subprocess.run(
            ["make", "-C", str(REPO), "image"],
            env=PODMAN_ENV,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
        _built.append(IMAGE)
    return _built[0]
