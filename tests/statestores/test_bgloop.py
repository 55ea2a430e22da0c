"""The background's ``loop`` mode (``statestores.bgloop``): tasks run later on the
submitting thread's event loop, a waiter runs a task not started yet, and a store's
uploads run there too — no thread started."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

import statestores
from remotes import PathRemote
from statestores import background
from statestores.bgloop import LoopSerial


@pytest.fixture
def loop_mode() -> Iterator[None]:
    old = background.set_mode("loop")
    try:
        yield
    finally:
        background.set_mode(old)


def _double(x: int) -> int:
    return 2 * x


def test_a_task_runs_later_on_the_loop_and_its_callback_there(loop_mode: None) -> None:
    seen: list[str] = []

    async def main() -> None:
        fut = background.submit(_double, 21, lane="upload")
        fut.add_done_callback(lambda f: seen.append(threading.current_thread().name))
        assert not fut.done()  # (later, not inline)
        assert await asyncio.wrap_future(fut) == 42

    asyncio.run(main())
    assert seen == [threading.current_thread().name]


def test_a_waiter_runs_the_task_it_waits_for(loop_mode: None) -> None:
    async def main() -> None:
        fut = background.submit(_double, 4, lane="flush")
        assert fut.result() == 8  # (on the loop's thread: would wait for ever otherwise)

    asyncio.run(main())


def test_no_loop_no_deferral(loop_mode: None) -> None:
    assert background.submit(_double, 3, lane="merge").result() == 6


def test_the_lanes_queues_are_bounded(loop_mode: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(background._loop_lanes, "bound", 2)

    async def main() -> None:
        futs = [background.submit(_double, i, lane="merge") for i in range(2)]
        with pytest.raises(background.BackgroundBusy):
            background.submit(_double, 9, lane="merge")
        assert [await asyncio.wrap_future(f) for f in futs] == [0, 2]
        background.submit(_double, 9, lane="merge").result()

    asyncio.run(main())


def test_a_serial_runs_in_order_each_at_its_time() -> None:
    ran: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        s = LoopSerial(8)
        t0 = loop.time()
        a = s.submit(lambda: ran.append(("a", loop.time() - t0)), not_before=t0 + 0.05)
        b = s.submit(lambda: ran.append(("b", loop.time() - t0)), not_before=t0)
        c = s.submit(lambda: ran.append(("c", loop.time() - t0)), not_before=t0 + 0.5)
        await asyncio.wrap_future(b)
        assert a.done() and [n for n, _ in ran] == ["a", "b"]
        assert ran[0][1] >= 0.05
        c.result()  # a waiter: runs it now, not at 0.5 s
        assert [n for n, _ in ran] == ["a", "b", "c"] and ran[2][1] < 0.5
        s.shutdown()

    asyncio.run(main())


def test_a_waiter_runs_the_serial_tasks_before_its_own_first() -> None:
    ran: list[int] = []

    async def main() -> None:
        s = LoopSerial(8)
        futs = [s.submit(ran.append, i, not_before=1e9) for i in range(3)]
        futs[1].result()
        assert ran == [0, 1]
        s.shutdown()
        assert ran == [0, 1, 2]

    asyncio.run(main())


def test_a_store_snapshots_and_restores_on_the_loop(loop_mode: None, tmp_path) -> None:
    threads = set(threading.enumerate())

    async def main() -> None:
        store = statestores.open("memonly", str(tmp_path / "s"),
                                 remote=PathRemote(str(tmp_path / "r")))
        store.put(b"k", b"1")
        fut = store.snapshot_async(1, delay=0.2)
        store.put(b"k", b"2")
        assert not fut.done()
        info = await asyncio.wrap_future(fut)
        assert info.snapshot_id == 1
        store.put(b"k", b"3")
        store.snapshot_async(2, delay=0.2)  # queued: the restore waits for it (a waiter)
        store.restore(1)
        assert store.get(b"k") == b"1" and store.snapshots() == [1, 2]
        store.close()

    asyncio.run(main())
    new = {t for t in threading.enumerate() if t not in threads}
    assert not [t for t in new if t.name.startswith("statestores-")], new


@pytest.mark.parametrize("engine", ["hybridlog", "appendlog", "lsm"])
def test_a_store_with_background_work_runs_it_all_on_the_loop(
        loop_mode: None, tmp_path, engine: str) -> None:
    """Flushes, seals, merges and the maintainer's inbox run on the loop too (a wait for
    them runs them): the values read back, a snapshot restores, and no thread started."""
    threads = set(threading.enumerate())
    small = ({"ro_lag_interval": 4, "flush_interval": 8} if engine == "hybridlog" else {})

    async def main() -> None:
        store = statestores.open(engine, str(tmp_path / "s"), **small,
                                 remote=PathRemote(str(tmp_path / "r")))
        for round_id in (1, 2):
            for i in range(300):
                store.put(f"k{i % 50}".encode(), f"{round_id}.{i}".encode())
                if i % 40 == 0:
                    await asyncio.sleep(0)  # (the loop runs what was handed to it)
            await asyncio.wrap_future(store.snapshot_async(round_id))
        store.put(b"k1", b"after")
        store.flush()
        store.compact()
        store.restore(1)
        assert {store.get(f"k{i}".encode()) for i in range(50)} == \
            {f"1.{i}".encode() for i in range(250, 300)}
        store.close()
        again = statestores.open(engine, str(tmp_path / "s"), **small,
                                 remote=PathRemote(str(tmp_path / "r")))
        assert again.get(b"k49") == b"1.299"
        again.close()

    asyncio.run(main())
    new = {t for t in threading.enumerate() if t not in threads}
    assert not [t for t in new if t.name.startswith("statestores-")], new
