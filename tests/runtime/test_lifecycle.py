"""A process's parts as services (``sfaas/runtime/lifecycle.py``): started in dependency
order and stopped in reverse through one ``stop()``; a failed or cancelled start still
stops what began, and the error names the part."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sfaas.runtime.lifecycle import Lifecycle, Service, start_order


class _Part(Service):
    """Records its starts and stops in ``log``; ``fail``: its start raises that."""

    def __init__(self, name: str, log: list[str], fail: BaseException | None = None,
                 hang: bool = False) -> None:
        self.part = name
        self._log = log
        self._fail = fail
        self._hang = hang

    async def on_start(self) -> None:
        self._log.append(f"start {self.part}")
        if self._hang:
            await asyncio.Event().wait()
        if self._fail is not None:
            raise self._fail

    async def on_stop(self) -> None:
        self._log.append(f"stop {self.part}")


def _parts(log: list[str], fail: BaseException | None = None,
           hang: bool = False) -> tuple[_Part, ...]:
    """topics ← listener ← workers ← watchdog, and a root requiring them all (rounds
    beside them); ``fail``, ``hang``: what the workers' start does."""
    topics, rounds, listener, watchdog = (
        _Part(n, log) for n in ("topics", "rounds", "listener", "watchdog"))
    workers = _Part("workers", log, fail, hang)
    listener.requires(topics)
    workers.requires(listener)
    watchdog.requires(workers)
    root = _Part("root", log).requires(watchdog, rounds)  # (watchdog first: deps go first)
    return root, topics, rounds, listener, workers, watchdog


def test_services_start_after_what_they_need_and_stop_in_reverse() -> None:
    log: list[str] = []
    root, *_ = _parts(log)
    assert [s.label for s in start_order(root)] == \
        ["topics", "listener", "workers", "watchdog", "rounds", "root"]

    async def go() -> None:
        await root.start()
        await root.stop()
        await root.stop()  # (stopping twice stops nothing more)
    asyncio.run(go())
    assert log == ["start topics", "start listener", "start workers", "start watchdog",
                   "start rounds", "start root",
                   "stop root", "stop rounds", "stop watchdog", "stop workers",
                   "stop listener", "stop topics"]


def test_a_failed_start_names_the_part_and_stops_what_began(
        caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    root, *_ = _parts(log, fail=OSError("address in use"))
    with caplog.at_level(logging.ERROR, "sfaas.lifecycle"), \
            pytest.raises(OSError, match="address in use") as info:
        asyncio.run(root.start())
    assert "(while starting workers)" in info.value.__notes__
    assert "workers did not start: address in use" in caplog.text
    # its own stop runs too: a part must cope with a partial start
    assert log == ["start topics", "start listener", "start workers",
                   "stop workers", "stop listener", "stop topics"]


def test_a_start_cancelled_midway_stops_what_began() -> None:
    """The coordinator stopped while it waits for its workers still tells those registered
    to stop."""
    log: list[str] = []
    root, *_ = _parts(log, hang=True)

    async def go() -> None:
        task = asyncio.create_task(root.start())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(go())
    assert log == ["start topics", "start listener", "start workers",
                   "stop workers", "stop listener", "stop topics"]


def test_a_failing_stop_is_logged_and_the_others_still_stop(
        caplog: pytest.LogCaptureFixture) -> None:
    stopped: list[str] = []
    parts = Lifecycle(logging.getLogger("test"))

    def broken() -> None:
        raise RuntimeError("kafka is gone")
    parts.started("stores", lambda: stopped.append("stores"))
    parts.started("producer", broken)
    with caplog.at_level(logging.ERROR, "test"):
        asyncio.run(parts.stop())
    assert stopped == ["stores"] and "stopping producer failed" in caplog.text


def test_a_dependency_cycle_is_a_wiring_error_naming_it() -> None:
    a, b = _Part("a", []), _Part("b", [])
    a.requires(b)
    b.requires(a)
    with pytest.raises(ValueError, match="in a cycle: a → b → a"):
        start_order(a)
