"""Fixtures of the process tests (tests/support/sco_process.py)."""

from tests.support.sco_process import env, process_db, processes

__all__ = ["env", "process_db", "processes"]
