"""Plugins for the SCO test cloud's OpenStack services (installed into the test-cloud venv)."""
