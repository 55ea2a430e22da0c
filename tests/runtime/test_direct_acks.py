"""A direct call's acknowledgement rides with the next request to the same worker, or goes
alone after ``ACK_DELAY`` (``sfaas.direct``, issue 47): never lost, never a frame of its own
while calls keep coming. A call a rescale took away from its worker stays on the direct
path. On fakes of the client's channel seam (the cluster tests in
``test_direct_calls.py`` run the real path)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from sfaas import direct
from sfaas.direct import DirectCalls
from sfaas.reads import Unavailable
from sfaas.runtime import wire
from sfaas.runtime.protocols.reads import MOVED, NOT_HERE

pytestmark = pytest.mark.usefixtures("watchdog")  # (tests/conftest.py: a hang fails fast)


class _Chan:
    """A client channel: what is sent, in the loop tick (one frame) it was queued in."""

    def __init__(self) -> None:
        self.peer = "worker-0"
        self.closed = False
        self.frames: list[list[wire.Message]] = []
        self._open: list[wire.Message] | None = None

    def send(self, msg: wire.Message) -> None:
        if self._open is None:  # (a Channel writes one frame per tick)
            self._open = []
            self.frames.append(self._open)
            asyncio.get_running_loop().call_soon(self._end_frame)
        self._open.append(msg)

    def _end_frame(self) -> None:
        self._open = None

    def sent(self, kind: type) -> list[Any]:
        return [m for f in self.frames for m in f if isinstance(m, kind)]


class _Path:
    """``sfaas.reads.DirectReads`` as the calls use it: one worker owns every partition."""

    def __init__(self, chan: _Chan) -> None:
        self.chan = chan
        self.available = True
        self.on_answer: Any = None
        self.on_closed: Any = None

    async def where(self, fresh: bool) -> Any:
        if not self.available:
            raise Unavailable("no placement (a recovery or a rescale is under way)")
        return SimpleNamespace(owners=[0], peers=[SimpleNamespace(host="h", port=1)])

    async def worker(self, host: str, port: int) -> _Chan:
        return self.chan


async def _call(calls: DirectCalls, path: _Path, rid: str) -> wire.Reply | None:
    """One call, answered by the worker as soon as its request is sent."""
    before = len(path.chan.sent(wire.Submit))
    task = asyncio.create_task(calls.call(rid, b"request", 0, asyncio.get_running_loop().time() + 5))
    while len(path.chan.sent(wire.Submit)) == before and not task.done():
        await asyncio.sleep(0)
    path.on_answer(path.chan, wire.Answer(wire.Reply(rid, True, 1).encode()))
    return await task


def test_an_acknowledgement_rides_in_the_next_requests_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct, "ACK_DELAY", 30.0)  # (no lone frame during the test)

    async def main() -> None:
        chan = _Chan()
        path = _Path(chan)
        calls = DirectCalls(path)  # type: ignore[arg-type]
        assert (await _call(calls, path, "r1")).ok  # type: ignore[union-attr]
        await asyncio.sleep(0.01)
        assert chan.sent(wire.Acked) == [], "acknowledged alone before the delay"
        assert (await _call(calls, path, "r2")).ok  # type: ignore[union-attr]
        frame = next(f for f in chan.frames if any(isinstance(m, wire.Acked) for m in f))
        assert [type(m) for m in frame] == [wire.Acked, wire.Submit]
        assert frame[0].rids == ["r1"]
        calls.flush()  # (what Client.close does before it closes the channels)
        assert [a.rids for a in chan.sent(wire.Acked)] == [["r1"], ["r2"]]

    asyncio.run(main())


def test_a_lone_acknowledgement_goes_after_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    # (a delay a loaded CI host cannot outlast between two calls: at 0.05 s, a's lone
    # acknowledgement once left before b's request, and b's before the check)
    monkeypatch.setattr(direct, "ACK_DELAY", 1.0)

    async def main() -> None:
        chan = _Chan()
        path = _Path(chan)
        calls = DirectCalls(path)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        for rid in ("a", "b"):
            assert (await _call(calls, path, rid)).ok  # type: ignore[union-attr]
        answered = loop.time()
        acked = [a.rids for a in chan.sent(wire.Acked)]
        assert acked == [["a"]]  # (rode with b's request)
        while len(chan.sent(wire.Acked)) < 2 and loop.time() - answered < 10:
            await asyncio.sleep(0.01)
        waited = loop.time() - answered
        acked = [a.rids for a in chan.sent(wire.Acked)]
        assert acked == [["a"], ["b"]], acked
        assert waited >= 0.9, f"b acknowledged alone {waited:.2f} s after its answer, before the delay"
        assert [type(m) for m in chan.frames[-1]] == [wire.Acked]

    asyncio.run(main())


def test_held_acknowledgements_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct, "ACK_DELAY", 30.0)
    monkeypatch.setattr(direct, "MAX_ACKS", 3)

    async def main() -> None:
        chan = _Chan()
        path = _Path(chan)
        DirectCalls(path)  # type: ignore[arg-type]
        for i in range(7):  # (answers to copies nobody waits for are acknowledged too)
            path.on_answer(chan, wire.Answer(wire.Reply(f"r{i}", True, i).encode()))
        assert [a.rids for a in chan.sent(wire.Acked)] == [["r0", "r1", "r2"], ["r3", "r4", "r5"]]

    asyncio.run(main())


def test_a_call_a_rescale_took_away_never_falls_back_to_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker had taken the request and gave it up when its partition moved (its
    re-run moves to the new owner): while the placement is unknown (the switch), the call
    must not go through Kafka, where it would run a second time (seen in
    test_rescale_standbys: one request committed at epoch 425 from the moved re-run and
    again at 428 from its Kafka copy)."""
    monkeypatch.setattr(direct, "FIRST_BACKOFF", 0.01)

    async def main() -> None:
        chan = _Chan()
        path = _Path(chan)
        calls = DirectCalls(path)  # type: ignore[arg-type]
        task = asyncio.create_task(calls.call("moving", b"request", 0,
                                              asyncio.get_running_loop().time() + 5))
        while not chan.sent(wire.Submit):
            await asyncio.sleep(0)
        path.available = False  # (the switch: no placement for a while)
        path.on_answer(chan, wire.Answer(wire.Reply("moving", False, None, NOT_HERE, MOVED).encode()))
        await asyncio.sleep(0.2)
        assert not task.done(), f"the call gave up the direct path: {task.result()}"
        assert calls.fell_back == 0
        path.available = True
        while len(chan.sent(wire.Submit)) < 2:
            await asyncio.sleep(0.005)
        path.on_answer(chan, wire.Answer(wire.Reply("moving", True, 1).encode()))
        reply = await task
        assert reply is not None and reply.value == 1 and calls.fell_back == 0

    asyncio.run(main())
