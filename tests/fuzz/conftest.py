"""Fuzz suites: every input the runtime and the stores read from outside, mutated.

See :mod:`tests.fuzz.budget` for how many inputs run (CI-sized by default,
``SFAAS_FUZZ_FULL=1`` for 10,000 per surface) and how to reproduce a failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.fuzz.budget import SEED, examples
from tests.fuzz.outcomes import Outcomes, spread


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":  # (the spread is checked only after a passing run)
        item.rep_call_passed = report.passed  # type: ignore[attr-defined]
    if report.when == "call" and report.failed:
        report.sections.append(("fuzz seed", f"SFAAS_FUZZ_SEED={SEED} reproduces this run "
                                             f"({examples()} inputs per test)"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spread(accepted, min_accepted, reasons, each): what a "
                            "fuzz test's inputs must reach (tests.fuzz.outcomes)")


@pytest.fixture
def outcomes(request: pytest.FixtureRequest) -> Iterator[Outcomes]:
    """Counts what each input led to; printed (``-s``) and recorded for the full run's note.
    A test using it declares the spread of outcomes it must show (``@pytest.mark.spread``),
    asserted after its last input."""
    marker = request.node.get_closest_marker("spread")
    assert marker is not None, f"{request.node.nodeid}: declare its spread (@pytest.mark.spread)"
    want = spread(*marker.args, **marker.kwargs)
    o = Outcomes(request.node.nodeid)
    yield o
    o.report()
    if getattr(request.node, "rep_call_passed", False):
        o.check(want)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A hang fails fast, with every thread's stack (pytest-timeout): 2 minutes per fuzz
    test in CI, an hour in the full run."""
    from tests.fuzz.budget import FULL

    for item in items:
        if "tests/fuzz/" in item.nodeid and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(3600 if FULL else 120))
