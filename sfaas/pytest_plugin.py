"""A pytest plugin (registered by the package, nothing to configure): a ``LocalRunner``
per test.

Point it at your app by overriding the ``sfaas_app`` fixture (in your ``conftest.py``)::

    @pytest.fixture
    def sfaas_app():
        from myshop import app
        return app

    def test_deposit(sfaas_runner):
        assert sfaas_runner.call("accounts", "alice", "deposit", 100) == 100

``sfaas_runner`` is a fresh :class:`~sfaas.testing.LocalRunner` (its own temporary
directory, the determinism check on), closed after the test. Options for it come from the
``sfaas_runner_options`` fixture (a dict of ``LocalRunner`` keyword arguments; override it
like ``sfaas_app``). It works in plain and in ``async`` tests (``await
sfaas_runner.call(...)`` inside a running loop).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sfaas.app import App
    from sfaas.testing import LocalRunner

__all__ = ["sfaas_app", "sfaas_runner_options", "sfaas_runner"]


@pytest.fixture
def sfaas_app() -> App:
    """The app ``sfaas_runner`` runs: override this fixture to return yours."""
    raise pytest.UsageError(
        "the sfaas_runner fixture needs your app: define a fixture named sfaas_app that "
        "returns it (e.g. in conftest.py: @pytest.fixture def sfaas_app(): return myapp.app)")


@pytest.fixture
def sfaas_runner_options() -> dict[str, Any]:
    """Keyword arguments for the ``LocalRunner`` (``workers``, ``store``, …): override to
    change them."""
    return {}


@pytest.fixture
def sfaas_runner(sfaas_app: App, sfaas_runner_options: dict[str, Any]) -> Iterator[LocalRunner]:
    """A fresh ``LocalRunner`` of ``sfaas_app``, closed after the test."""
    from sfaas.testing import LocalRunner

    with LocalRunner(sfaas_app, **sfaas_runner_options) as runner:
        yield runner
