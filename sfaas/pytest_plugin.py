"""A pytest plugin (registered by the package, nothing to configure): a ``LocalRunner``
per test, for plain and ``async`` tests alike.

Point it at your app by overriding the ``sfaas_app`` fixture (in your ``conftest.py``)::

    @pytest.fixture
    def sfaas_app():
        from myshop import app
        return app

    def test_deposit(sfaas_runner):
        assert sfaas_runner.call("accounts", "alice", "deposit", 100) == 100

    async def test_deposits(sfaas_runner):
        assert await sfaas_runner.agather(("accounts", "a", "deposit", 1),
                                          ("accounts", "b", "deposit", 2)) == [1, 2]

``sfaas_runner`` is a fresh :class:`~sfaas.testing.LocalRunner` (its own temporary
directory, the determinism check on), closed after the test. Options for it come from the
``sfaas_runner_options`` fixture (a dict of ``LocalRunner`` keyword arguments; override it
like ``sfaas_app``). Plain tests use the blocking verbs (``call``, ``gather``, ``get``, …),
``async`` tests their ``a*`` twins (``acall``, ``agather``, ``aget``, …).

``async def`` tests need no other plugin: one that uses ``sfaas_runner`` (directly or
through another fixture) runs in a fresh event loop of its own (``asyncio.run``) unless
another plugin runs it — pytest-asyncio does when it is active (then its loop serves the
test; the runner works from any loop), and a test marked for ``anyio`` or ``trio`` is left
to those plugins.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sfaas.app import App
    from sfaas.testing import LocalRunner

__all__ = ["sfaas_app", "sfaas_runner_options", "sfaas_runner", "pytest_pyfunc_call"]

#: markers of the plugins that run ``async def`` tests on other event loops than asyncio's
_OTHER_RUNNERS = ("anyio", "trio")


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


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``async def`` test that uses ``sfaas_runner`` with :func:`asyncio.run`.

    A test another plugin runs is not one here any more: pytest-asyncio replaces the
    coroutine function by a plain one before this hook, so only tests no plugin took — it
    is absent, disabled (``-p no:asyncio``) or in strict mode without the mark — come here,
    which pytest itself would fail ("async def functions are not natively supported").
    """
    test = pyfuncitem.obj
    if not inspect.iscoroutinefunction(test) or "sfaas_runner" not in pyfuncitem.fixturenames \
            or any(pyfuncitem.get_closest_marker(m) for m in _OTHER_RUNNERS):
        return None
    params = inspect.signature(test).parameters
    args = {name: pyfuncitem.funcargs[name] for name, p in params.items()
            if p.default is p.empty and name in pyfuncitem.funcargs}
    asyncio.run(test(**args))
    return True
