"""The simulated object store's faults (``sfaas.sim.objects``): what a caller of a remote
sees of errors and outages — ``RemoteError`` only after the retries ``remotes.minio``
makes, time passed — drawn from a seed."""

from __future__ import annotations

import asyncio
import gc
import pickle
import random
from pathlib import Path

import pytest

from remotes import RemoteError
from remotes._retry import RetryPolicy
from sfaas.sim import clock
from sfaas.sim.objects import ObjectFaults, SimObjectStore


def test_a_drawn_error_fails_the_call_and_changes_nothing(tmp_path: Path) -> None:
    store = SimObjectStore(faults=ObjectFaults(error=1.0))
    r = store.remote("p")
    (tmp_path / "f").write_bytes(b"data")
    with pytest.raises(RemoteError, match="put file failed"):
        r.put_file("run-1", tmp_path / "f")
    with pytest.raises(RemoteError, match="put blob failed"):
        r.put_blob("b", b"x")
    store.faults.error = 0.0
    assert r.list_files() == {} and r.get_blob("b") is None


def test_errors_and_latency_replay_from_the_seed() -> None:
    def run(seed: int) -> list[str]:
        store = SimObjectStore(random.Random(seed), ObjectFaults(error=0.8, latency=(0.01, 0.2)))
        r = store.remote("p")
        out = []
        for i in range(40):
            try:
                r.put_blob(f"b{i}", b"v")
                out.append(f"ok {store.waited!r}")
            except RemoteError:
                out.append(f"err {store.waited!r}")
        return out
    first = run(3)
    assert "err" in " ".join(first) and "ok" in " ".join(first)
    assert run(3) == first and run(4) != first


def test_a_transient_error_rate_is_retried_away_as_minio_remote_retries_it() -> None:
    """0.2 per try, as a flaky MinIO's requests: ``MinioRemote`` retries each (6 tries), so
    a call fails with p 0.2**6 — a thousand calls (a recovery's restores) go through, about
    a fifth of their tries retried after a backoff (the old model failed a fifth of the
    calls whole: seed 95's recoveries never completed)."""
    store = SimObjectStore(random.Random(95), ObjectFaults(error=0.2))
    r = store.remote("p")
    failed = 0
    for i in range(1000):
        try:
            r.put_blob(f"b{i}", b"v")
        except RemoteError:
            failed += 1
    assert failed == 0 and r.get_blob("b999") == b"v"
    assert 0.15 < store.failed_tries / store.tries < 0.25 and store.calls == 1001
    # (each failed try's backoff, at least RetryPolicy.delay(1)'s 0.125 s, counted)
    assert store.waited >= store.failed_tries * RetryPolicy().base_delay / 2


@pytest.mark.parametrize("policy", [RetryPolicy(), RetryPolicy(attempts=3),
                                    RetryPolicy(deadline=0.3)])
def test_a_call_fails_after_the_policys_tries_and_backoff_in_virtual_time(
        policy: RetryPolicy) -> None:
    """Every try failing: ``RemoteError`` after the policy's tries (``attempts``, fewer when
    the next backoff would pass ``deadline``), each backoff of ``RetryPolicy.delay``'s range
    — passed on the virtual clock when given as ``backoff_sleep``; nothing changed."""
    def bounds(failed: int) -> tuple[float, float]:
        d = min(policy.max_delay, policy.base_delay * 2.0 ** (failed - 1))
        return d / 2, d

    # (6 or 3 tries, as many as the policy allows: their pauses sum to at most 7.75 s; with
    # a 0.3 s deadline the second pause, at least 0.25 s after at least 0.125 s, passes it)
    expected = policy.attempts if policy.deadline >= 10 else 2
    plain = SimObjectStore(random.Random(1), ObjectFaults(error=1.0), retry=policy)
    with pytest.raises(RemoteError, match=f"get blob failed after {expected} tries"):
        plain.remote("p").get_blob("a")
    low = sum(bounds(i)[0] for i in range(1, expected))
    assert low <= plain.waited <= sum(bounds(i)[1] for i in range(1, expected))

    async def main() -> int:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, clock.VirtualLoop)
        pauses: list[float] = []

        def sleep(seconds: float) -> None:
            pauses.append(seconds)
            loop.clock.advance(seconds)
        store = SimObjectStore(loop.random, ObjectFaults(error=1.0), sleep=loop.clock.advance,
                               clock=loop.time, retry=policy, backoff_sleep=sleep)
        r = store.remote("p")
        with pytest.raises(RemoteError, match=r"put blob failed after (\d) tries") as e:
            await asyncio.to_thread(r.put_blob, "a", b"1")
        tries = int(e.value.args[0].split(" tries")[0].rsplit(" ", 1)[1])
        assert len(pauses) == tries - 1 and store.tries == tries
        for failed, pause in enumerate(pauses, 1):
            assert bounds(failed)[0] <= pause <= bounds(failed)[1]
        assert loop.time() == sum(pauses) == store.waited <= policy.deadline
        if tries < policy.attempts:  # (the deadline stopped it: the next pause would pass it)
            assert loop.time() + bounds(tries)[0] > policy.deadline
        store.faults.error = 0.0
        assert r.get_blob("a") is None
        return tries
    assert clock.run(main(), seed=1) == expected


def test_the_same_seed_retries_alike() -> None:
    """Same seed, same tries, same backoff: a run is a function of its seed."""
    def run(seed: int) -> tuple[int, int, float]:
        store = SimObjectStore(random.Random(seed), ObjectFaults(error=0.5))
        r = store.remote("p")
        for i in range(50):
            try:
                r.put_blob(f"b{i}", b"v")
            except RemoteError:
                pass
        tries, waited = store.tries, store.waited
        store.faults.error = 0.0
        return tries, sum(r.get_blob(f"b{i}") is not None for i in range(50)), waited
    assert run(7) == run(7) and run(7) != run(8)


def test_latency_and_outages_pass_virtual_time_under_the_loop() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, clock.VirtualLoop)
        store = SimObjectStore(loop.random, ObjectFaults(latency=(0.5, 0.5)),
                               sleep=loop.clock.advance, clock=loop.time)
        r = store.remote("p")
        await asyncio.to_thread(r.put_blob, "a", b"1")  # (inline on the virtual loop)
        assert loop.time() == 0.5
        store.faults.latency = (0.0, 0.0)
        store.outage(4.0)  # within the retry deadline (10 s): the call waits it out
        assert await asyncio.to_thread(r.get_blob, "a") == b"1"
        assert loop.time() == 4.5
        store.outage(60.0)  # longer: it fails after the deadline
        with pytest.raises(RemoteError, match="outage"):
            await asyncio.to_thread(r.get_blob, "a")
        assert loop.time() == 14.5
        await asyncio.sleep(60.0)
        assert r.get_blob("a") == b"1"
    clock.run(main(), seed=1)


def test_a_pickled_remote_of_a_store_gone_says_so() -> None:
    data = pickle.dumps(SimObjectStore().remote("p"))  # (its store is garbage at once)
    gc.collect()
    with pytest.raises(RemoteError, match="not in this process"):
        pickle.loads(data)
