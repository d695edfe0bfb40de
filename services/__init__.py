"""The long-running processes: one package each (its loop, its metrics, its `run`), and
the one list of them all (`services/registry.py`) that the CLI, the box and the tests read."""
