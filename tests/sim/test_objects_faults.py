"""The simulated object store's faults (``sfaas.sim.objects``): what a caller of a remote
sees of an outage — ``RemoteError`` after the retries, time passed — drawn from a seed."""

from __future__ import annotations

import asyncio
import gc
import pickle
import random
from pathlib import Path

import pytest

from remotes import RemoteError
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
        store = SimObjectStore(random.Random(seed), ObjectFaults(error=0.3, latency=(0.01, 0.2)))
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
