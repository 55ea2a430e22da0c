"""What the inputs of one fuzz test led to, counted by outcome (a named error, a value), and
the spread a fuzz test must show (issue 48: a generator whose inputs all die at the first
byte must fail, not pass).

Printed at the end of each test (visible with ``-s``) and appended as one JSON line to
``$SFAAS_FUZZ_REPORT`` when that is set (the full run's record).

A test declares its spread with ``@pytest.mark.spread(...)`` (:func:`spread`): the outcomes
that mean an input got through every check (``accepted``) and the share of the inputs that
must have them; the decoder's stages some rejected input must have died at (``stages``:
a part of each stage's error message — e.g. "not msgpack", "needs N fields", "checksum
mismatch" — matched against the errors' messages with their numbers blanked to ``N`` and
quoted parts to ``Q``); and outcomes at least one input must have had (``each``). The
``outcomes`` fixture asserts it after the test's last input (``SFAAS_FUZZ_REASONS=1``
prints every distinct rejection, to pick the stages).

The stages are chosen so the CI sample (400 inputs a surface, the fixed seed of
``tests.fuzz.budget``) reaches each of them; a rare stage may be missed by a sample that
small drawn from another seed (seed 1 missed five of them, 2026-11-29), so run another seed
with a larger sample — ``SFAAS_FUZZ_SEED=S SFAAS_FUZZ_EXAMPLES=3000`` reached every stage
of the manifest and frame fuzzers with seed 1 — or ``SFAAS_FUZZ_FULL=1``. A change to a
message's fields moves the seeded sample too: a stage it then misses is one to reach by
construction in the generator, not one to drop.
"""

from __future__ import annotations

import collections
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

#: below this many inputs (``SFAAS_FUZZ_EXAMPLES=5``, to replay one) a spread says nothing
MIN_INPUTS_FOR_SPREAD = 60

_QUOTED = re.compile(r"b?'[^']*'|b?\"[^\"]*\"|<[^>]*>|\[[^\]]*\]|\{[^}]*\}|\([^)]*\)")
_NUMBER = re.compile(r"-?\d+(\.\d+)?(e-?\d+)?")


def reason(exc: BaseException) -> str:
    """The check an error came from: its type and message, values blanked."""
    text = _NUMBER.sub("N", _QUOTED.sub("Q", str(exc)))
    return f"{type(exc).__name__}: {' '.join(text.split()[:8])}"


@dataclass(frozen=True)
class Spread:
    """What a test's inputs must reach (see the module docstring)."""

    accepted: tuple[str, ...]
    min_accepted: float = 0.05
    #: a part of the message of each decoder stage some rejected input must have died at
    stages: tuple[str, ...] = ()
    #: outcomes each of which at least one input must have had
    each: tuple[str, ...] = ()


def spread(accepted: Iterable[str], min_accepted: float = 0.05, stages: Iterable[str] = (),
           each: Iterable[str] = ()) -> Spread:
    return Spread(tuple(accepted), min_accepted, tuple(stages), tuple(each))


class Outcomes:
    """A counter of outcomes of one test's inputs."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.counts: collections.Counter[str] = collections.Counter()
        self.reasons: collections.Counter[str] = collections.Counter()
        self.started = time.monotonic()

    def add(self, outcome: str) -> None:
        self.counts[outcome] += 1

    def error(self, exc: BaseException) -> None:
        self.add(type(exc).__name__)
        self.reasons[reason(exc)] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def check(self, want: Spread) -> None:
        """Assert ``want``: enough inputs accepted, some rejected at every stage of
        ``want.stages``, every outcome of ``want.each`` reached."""
        if self.total < MIN_INPUTS_FOR_SPREAD:
            return
        ok = sum(self.counts[a] for a in want.accepted)
        seen = dict(self.counts.most_common())
        assert ok >= want.min_accepted * self.total, (
            f"{self.test}: only {ok} of {self.total} inputs reached {want.accepted} "
            f"(at least {want.min_accepted:.0%} must): {seen}")
        unreached = [st for st in want.stages if not any(st in r for r in self.reasons)]
        assert not unreached, (
            f"{self.test}: no input was rejected at {unreached}; the rejections: "
            f"{dict(self.reasons.most_common(20))}")
        missing = [o for o in want.each if not self.counts[o]]
        assert not missing, f"{self.test}: no input reached {missing}: {seen}"

    def report(self) -> None:
        seconds = time.monotonic() - self.started
        line = {"test": self.test, "inputs": self.total, "seconds": round(seconds, 1),
                "outcomes": dict(self.counts.most_common()), "reasons": len(self.reasons)}
        print(f"\nfuzz {self.test}: {self.total} inputs in {seconds:.1f} s: "
              f"{dict(self.counts.most_common())}; {len(self.reasons)} distinct rejections")
        if os.environ.get("SFAAS_FUZZ_REASONS") == "1":
            for r, n in self.reasons.most_common():
                print(f"  {n:5d}  {r[:150]}")
        path = os.environ.get("SFAAS_FUZZ_REPORT")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")
