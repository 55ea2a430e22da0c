"""What the inputs of one fuzz test led to, counted by outcome (a named error, a value).

Printed at the end of each test (visible with ``-s``) and appended as one JSON line to
``$SFAAS_FUZZ_REPORT`` when that is set (the full run's record).
"""

from __future__ import annotations

import collections
import json
import os
import time


class Outcomes:
    """A counter of outcomes of one test's inputs."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.counts: collections.Counter[str] = collections.Counter()
        self.started = time.monotonic()

    def add(self, outcome: str) -> None:
        self.counts[outcome] += 1

    def error(self, exc: BaseException) -> None:
        self.add(type(exc).__name__)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def report(self) -> None:
        seconds = time.monotonic() - self.started
        line = {"test": self.test, "inputs": self.total, "seconds": round(seconds, 1),
                "outcomes": dict(self.counts.most_common())}
        print(f"\nfuzz {self.test}: {self.total} inputs in {seconds:.1f} s: {dict(self.counts.most_common())}")
        path = os.environ.get("SFAAS_FUZZ_REPORT")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")
