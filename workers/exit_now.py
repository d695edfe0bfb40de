"""Leave a short-lived program without interpreter teardown, whatever `main` does.

A process that has run a Temporal client or worker holds the Rust runtime's threads; at
interpreter teardown they can abort it (SIGABRT in PyGILState_Release): a core file under
slurmctld, a bench that printed its report and still "failed" with exit -6. `main`'s own
`finally` blocks have run by then, and so do the `atexit` handlers (before `os._exit`,
which skips them): a bench's test NATS server (tests/support/worker_nats.py) is stopped
by one, and was left running once per bench run without it. Only the interpreter's
teardown is skipped."""

from __future__ import annotations

import atexit
import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn


def run_and_exit(main: Callable[[], int | None]) -> NoReturn:
    """Run `main`; exit with its code (None: 0) through `os._exit`. An unexpected exception
    is printed and exits 1 the same way; `SystemExit` (argparse's usage errors) keeps its
    code."""
    try:
        code = main() or 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BaseException:
        traceback.print_exc()
        code = 1
    # Plain Python, before the teardown that aborts; each handler's own exception is
    # printed by atexit and the rest still run.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
