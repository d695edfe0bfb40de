"""Where things are, for tests and benchmarks: the repository, its region files and example
contracts, and the recorded test data (histories, Kubernetes recordings, schemas)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REGIONS_DIR = REPO / "deploy" / "regions"
EXAMPLES = REPO / "contracts" / "examples"
DATA = REPO / "tests" / "data"
#: The machine's PostgreSQL, where every test and bench makes its scratch databases.
BASE_DSN = os.environ.get("SCO_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
