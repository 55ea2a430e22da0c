"""How much the fuzz suites run: one place for every surface.

CI runs a small, fixed-seed sample of every surface (``CI_EXAMPLES`` per test, the whole
suite in about 45 s on two cores). The full
run — at least 10,000 inputs per surface — is ``SFAAS_FUZZ_FULL=1``;
``SFAAS_FUZZ_EXAMPLES=N`` sets the count per test directly, ``SFAAS_FUZZ_SEED=S`` another
seed (the seed is printed with every failure, so a failure reproduces).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import HealthCheck, seed, settings

F = TypeVar("F", bound=Callable[..., Any])

#: Whether this is the full run (10,000 inputs per surface, 200 local clusters).
FULL = os.environ.get("SFAAS_FUZZ_FULL") == "1"
#: Inputs per surface in the full run.
FULL_EXAMPLES = 10_000
#: Inputs per test in CI (each surface has one to four tests).
CI_EXAMPLES = 400
SEED = int(os.environ.get("SFAAS_FUZZ_SEED") or 20260211)


def examples(share: float = 1.0) -> int:
    """Inputs for one test that covers ``share`` of its surface's inputs."""
    explicit = os.environ.get("SFAAS_FUZZ_EXAMPLES")
    if explicit:
        return max(1, int(explicit))
    if FULL:
        return max(1, int(FULL_EXAMPLES * share + 0.999))
    return max(1, int(CI_EXAMPLES * min(1.0, share * 2)))


#: The health checks every fuzz test runs without: ``function_scoped_fixture``, because the
#: ``outcomes`` fixture is function-scoped on purpose — one counter across all of a test's
#: inputs, whose spread it checks after the last one (``tests.fuzz.outcomes``); and
#: ``too_slow``, a wall-clock bound on generating inputs, which a loaded 2-core CI machine
#: trips (timing belongs in benchmarks; the spread, not the clock, says a generator works).
#: Every other check is on, unless a test names it (``fuzz(suppress=...)``, saying why).
ALWAYS_SUPPRESSED = (HealthCheck.function_scoped_fixture, HealthCheck.too_slow)


def fuzz(share: float = 1.0, suppress: tuple[HealthCheck, ...] = ()) -> Callable[[F], F]:
    """The hypothesis settings of a fuzz test: a fixed seed, no example database (a run
    depends on the seed alone), no deadline, ``examples(share)`` inputs, the health
    checks on but :data:`ALWAYS_SUPPRESSED` and ``suppress``."""

    def wrap(fn: F) -> F:
        fn = settings(
            max_examples=examples(share),
            database=None,
            deadline=None,
            derandomize=False,
            print_blob=True,
            suppress_health_check=[*ALWAYS_SUPPRESSED, *suppress],
        )(fn)
        return seed(SEED)(fn)  # type: ignore[no-any-return]

    return wrap
