"""The retry loop and the transient-error classification, without any network."""

from __future__ import annotations

import pytest
import urllib3
from minio.error import InvalidResponseError, S3Error, ServerError

from remotes._retry import RetriesExhausted, RetryPolicy, retry_call
from remotes.minio import is_transient


class Flaky:
    def __init__(self, failures: int, exc: Exception) -> None:
        self.failures = failures
        self.exc = exc
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc
        return "ok"


class FakeTime:
    """A clock that only moves when the retry loop sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def run(fn: Flaky, policy: RetryPolicy, sleeps: list[float]) -> str:
    fake = FakeTime()
    fake.sleeps = sleeps
    return retry_call(fn, policy=policy, is_transient=lambda e: isinstance(e, ConnectionError),
                      what="test op", sleep=fake.sleep, clock=fake.clock)


def test_succeeds_after_transient_failures_with_growing_backoff() -> None:
    sleeps: list[float] = []
    fn = Flaky(3, ConnectionError("refused"))
    assert run(fn, RetryPolicy(attempts=5, base_delay=0.1, max_delay=10, deadline=100), sleeps) == "ok"
    assert fn.calls == 4
    assert len(sleeps) == 3
    # equal jitter: each pause is in [d/2, d] with d doubling from base_delay
    for i, s in enumerate(sleeps):
        d = 0.1 * 2**i
        assert d / 2 <= s <= d


def test_gives_up_after_attempts_with_the_last_error() -> None:
    sleeps: list[float] = []
    fn = Flaky(100, ConnectionError("still down"))
    with pytest.raises(RetriesExhausted) as info:
        run(fn, RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.01, deadline=100), sleeps)
    assert fn.calls == 4 and info.value.attempts == 4 and len(sleeps) == 3
    assert isinstance(info.value.last, ConnectionError)


def test_deadline_stops_before_attempts_run_out() -> None:
    sleeps: list[float] = []
    fn = Flaky(100, ConnectionError("down"))
    with pytest.raises(RetriesExhausted):
        # pauses are >= 1 s, 2 s, 4 s, ...: at most two fit in a 3.5 s deadline
        run(fn, RetryPolicy(attempts=50, base_delay=2.0, max_delay=100, deadline=3.5), sleeps)
    assert 2 <= fn.calls <= 3
    assert sum(sleeps) <= 3.5


def test_non_transient_error_is_not_retried() -> None:
    sleeps: list[float] = []
    fn = Flaky(1, PermissionError("denied"))
    with pytest.raises(PermissionError):
        run(fn, RetryPolicy(), sleeps)
    assert fn.calls == 1 and sleeps == []


def test_delays_are_capped() -> None:
    p = RetryPolicy(attempts=20, base_delay=1, max_delay=3, deadline=1000)
    assert max(p.delay(i) for i in range(1, 20)) <= 3


def s3(code: str, status: int | None = None) -> S3Error:
    response = None
    if status is not None:
        response = urllib3.HTTPResponse(status=status)
    return S3Error(response, code, "msg", "/bucket/key", "req", "host")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (s3("SlowDown", 503), True),
        (s3("InternalError", 500), True),
        (s3("ServiceUnavailable"), True),
        (s3("XMinioServerNotInitialized", 503), True),
        (s3("NoSuchKey", 404), False),
        (s3("AccessDenied", 403), False),
        (s3("SignatureDoesNotMatch", 403), False),
        (s3("SomethingNew", 502), True),
        (ServerError("boom", 503), True),
        (ServerError("teapot", 418), False),
        (InvalidResponseError(502, "text/html", "<html>bad gateway</html>"), True),
        (InvalidResponseError(400, "text/html", "nope"), False),
        (urllib3.exceptions.NewConnectionError(None, "refused"), True),  # type: ignore[arg-type]
        (urllib3.exceptions.ProtocolError("reset"), True),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (FileNotFoundError("local"), False),
        (ValueError("bad"), False),
    ],
)
def test_transient_classification(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient
