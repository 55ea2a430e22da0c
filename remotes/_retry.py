"""Bounded retries with exponential backoff and jitter for transient remote errors."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["RetryPolicy", "retry_call"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transient failure.

    Try ``attempts`` times at most; before try *i* (i ≥ 1) sleep ``d/2 + uniform(0, d/2)``
    with ``d = min(max_delay, base_delay * 2**(i-1))`` ("equal jitter": spreads clients
    apart but still grows). No new try starts once ``deadline`` seconds have passed since
    the first one, so a remote that stays down fails within about ``deadline`` seconds
    (plus one request timeout).
    """

    attempts: int = 6
    base_delay: float = 0.25
    max_delay: float = 4.0
    deadline: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        for field in ("base_delay", "max_delay", "deadline"):
            if getattr(self, field) < 0:
                raise ValueError(f"RetryPolicy.{field} must be >= 0, got {getattr(self, field)}")

    def delay(self, attempt: int) -> float:
        """Sleep before try number ``attempt`` (1-based count of failures so far)."""
        d = min(self.max_delay, self.base_delay * 2.0 ** (attempt - 1))
        return d / 2 + random.uniform(0, d / 2)


class RetriesExhausted(Exception):
    """Internal: the last transient error, after ``attempts`` tries."""

    def __init__(self, last: BaseException, attempts: int, elapsed: float) -> None:
        super().__init__(str(last))
        self.last = last
        self.attempts = attempts
        self.elapsed = elapsed


def retry_call(
    fn: Callable[[], T],
    *,
    policy: RetryPolicy,
    is_transient: Callable[[BaseException], bool],
    what: str,
    scrub: Callable[[str], str] = str,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Call ``fn`` until it succeeds, a non-transient error escapes, or the policy is spent.

    Raises :class:`RetriesExhausted` (carrying the last error) when every try failed with a
    transient error; ``what`` names the operation in log messages, and ``scrub`` cleans
    error texts before they are logged (e.g. removes a secret). ``sleep``/``clock`` are
    seams for tests.
    """
    start = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as e:
            if not is_transient(e):
                raise
            elapsed = clock() - start
            if attempt >= policy.attempts:
                raise RetriesExhausted(e, attempt, elapsed) from e
            pause = policy.delay(attempt)
            if elapsed + pause > policy.deadline:
                raise RetriesExhausted(e, attempt, elapsed) from e
            log.warning(
                "transient error in %s (try %d/%d), retrying in %.2fs: %s: %s",
                what, attempt, policy.attempts, pause, type(e).__name__, scrub(str(e)),
            )
            sleep(pause)
