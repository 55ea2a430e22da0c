"""Where a hanging test's last words go (``tests/conftest.py``'s ``watchdog`` fixture and
the stress tests' own)."""

from __future__ import annotations

import sys

import pytest


def terminal_fd(config: pytest.Config) -> int:
    """A descriptor for the terminal's stderr: pytest's capture holds fd 2 in a temporary
    file, which is lost when the watchdog ends the process. pytest's faulthandler plugin
    keeps a copy of the real one; without it, fall back to fd 2."""
    try:
        from _pytest.faulthandler import fault_handler_stderr_fd_key

        return config.stash[fault_handler_stderr_fd_key]
    except (ImportError, KeyError):
        assert sys.__stderr__ is not None
        return sys.__stderr__.fileno()
