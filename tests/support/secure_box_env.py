"""The environment of a secure box of its own (`Box(profile="secure")`) for a test or a
bench: its data directory, a scratch fleet database, and every listener on a free port,
OpenBao's included (the box starts one by default, at 8200 unless told), so two secure
boxes, a developer's `make up` and the suite never meet on a port."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

from tests.support import services
from tests.support.paths import REGIONS_DIR


def secure_box_env(prefix: str, **extra: str) -> tuple[Path, dict[str, str]]:
    """A fresh directory (outside pytest's tmp tree, which is private to root: the box's
    PostgreSQL runs as the postgres user) and the `SCO_*` settings of a box in it; `extra`
    adds or overrides settings (e.g. `SCO_IDENTITY__TTL_SECONDS`)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"sco-{prefix}-"))
    env = {
        "SCO_DATA_DIR": str(tmp / "sco"),
        "SCO_REGIONS_DIR": str(REGIONS_DIR),
        "SCO_POSTGRES_DSN": (
            f"postgresql://postgres@127.0.0.1:5432/{prefix.replace('-', '_')[:12]}_"
            f"{uuid.uuid4().hex[:8]}"
        ),
        "SCO_BOX__SECURE_POSTGRES_PORT": str(services.free_port()),
        "SCO_BOX__SECURE_NATS_PORT": str(services.free_port()),
        "SCO_BOX__SECURE_TEMPORAL_PORT": str(services.free_port()),
        "SCO_BOX__SECURE_TEMPORAL_BACKEND_PORT": str(services.free_port()),
        "SCO_BOX__SECURE_KAFKA_BACKEND_PORT": str(services.free_port()),
        # OpenBao's API and, on the next port, its cluster listener.
        "SCO_OPENBAO__ADDRESS": f"https://127.0.0.1:{services.free_port_range(2)}",
        "SCO_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{services.free_port()}",
        "SCO_PROMETHEUS__PORT": str(services.free_port()),
        "SCO_PROMETHEUS__BOX_PORTS_FROM": str(services.free_port_range(32)),
    }
    env.update(extra)
    return tmp, env
