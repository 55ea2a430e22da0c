"""The virtual-time loop (``sfaas.sim.clock``): time moves by exactly what is waited for,
timers keep their order, real I/O is refused, and a seed replays a run byte for byte."""

from __future__ import annotations

import asyncio
import socket

import pytest

from sfaas.sim import clock


def test_time_advances_by_exactly_the_sleeps() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        seen = [loop.time()]
        for d in (3600.0, 0.25, 1.5, 86400.0 * 3):  # (3 days: more than one select's wait)
            await asyncio.sleep(d)
            seen.append(loop.time())
        await asyncio.sleep(0)
        seen.append(loop.time())
        return seen
    assert clock.run(main(), seed=0, start=100.0) == \
        [100.0, 3700.0, 3700.25, 3701.75, 3701.75 + 259200.0, 3701.75 + 259200.0]


def test_work_between_awaits_takes_no_virtual_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        sum(range(200_000))
        await asyncio.to_thread(sum, range(1000))  # (run inline: no thread)
        return loop.time() - t0
    assert clock.run(main(), seed=0) == 0.0


def test_timers_fire_in_deadline_order_and_ties_in_scheduling_order() -> None:
    async def main() -> list[tuple[float, str]]:
        loop = asyncio.get_running_loop()
        fired: list[tuple[float, str]] = []
        for name, at in [("c", 3.0), ("a", 1.0), ("b1", 2.0), ("b2", 2.0), ("d", 2.5)]:
            loop.call_at(at, lambda n=name: fired.append((loop.time(), n)))

        async def sleeper() -> None:
            await asyncio.sleep(2.0)
            fired.append((loop.time(), "task"))
        task = loop.create_task(sleeper())
        await asyncio.sleep(5.0)
        await task
        return fired
    assert clock.run(main(), seed=0) == [
        (1.0, "a"), (2.0, "b1"), (2.0, "b2"), (2.0, "task"), (2.5, "d"), (3.0, "c")]


def test_wait_for_times_out_on_virtual_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 30.0)
        return loop.time()
    assert clock.run(main(), seed=0) == 30.0


def test_a_run_that_can_never_go_on_raises_stuck() -> None:
    async def main() -> None:
        await asyncio.Event().wait()
    with pytest.raises(clock.Stuck):
        clock.run(main(), seed=0)


def test_real_sockets_are_refused() -> None:
    async def main() -> None:
        with pytest.raises(clock.RealIOError):
            await asyncio.open_connection("127.0.0.1", 9)
        with pytest.raises(clock.RealIOError):
            await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        try:
            with pytest.raises(clock.RealIOError):
                loop.add_reader(a.fileno(), lambda: None)
        finally:
            a.close()
            b.close()
    clock.run(main(), seed=0)


def _trace(seed: int) -> bytes:
    """Tasks that sleep random times and log when they wake, drawn from the loop's seeded
    random source."""
    lines: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, clock.VirtualLoop)

        async def actor(n: int) -> None:
            for i in range(25):
                await asyncio.sleep(loop.random.choice([0.0, 0.001, 0.5, loop.random.random()]))
                lines.append(f"{loop.time()!r} actor {n} step {i}")
        await asyncio.gather(*(actor(n) for n in range(4)))
    clock.run(main(), seed=seed)
    return "\n".join(lines).encode()


def test_two_runs_of_a_seed_give_the_same_trace() -> None:
    first = _trace(5)
    assert len(first.splitlines()) == 100
    assert _trace(5) == first
    assert _trace(6) != first
