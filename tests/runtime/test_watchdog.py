"""The coordinator's watchdog loses a silent worker, but not for a stall of its own loop
(``coordinator.watchdog``): the beats that arrived meanwhile wait unread in its sockets."""

from __future__ import annotations

import asyncio
import time

from tests.runtime.test_kafka_cut import T, _members, _State, _watchdog


class _StallingState(_State):
    """The watchdog's ticks, the second of which blocks the whole loop for ``stall`` s."""

    def __init__(self, members, stall: float) -> None:  # type: ignore[no-untyped-def]
        super().__init__(members)
        self.ticks, self.stall = 0, stall

    async def kafka_silence_news(self, timeout: float) -> None:
        await asyncio.sleep(timeout)
        self.ticks += 1
        if self.ticks == 2:
            time.sleep(self.stall)  # (the loop stands still: no reader runs before the check)


async def _lost_after(state: _State, seconds: float) -> list[int]:
    dog = _watchdog(state)
    await dog.on_start()
    await asyncio.sleep(seconds)
    await dog.on_stop()
    return state.lost


def test_a_stall_of_the_coordinators_own_loop_loses_nobody() -> None:
    members = _members(0.0, 0.0)
    state = _StallingState(members, stall=2 * T)

    async def run() -> list[int]:
        async def beat() -> None:  # (the workers' beats, read whenever the loop runs)
            while True:
                for m in members:
                    m.last_seen = time.monotonic()
                await asyncio.sleep(T / 4)

        beats = asyncio.create_task(beat())
        try:
            return await _lost_after(state, 3 * T)
        finally:
            beats.cancel()

    assert asyncio.run(run()) == []
    assert state.ticks > 2  # (it did stall, and watched on)


def test_a_member_silent_past_the_stall_is_still_lost() -> None:
    members = _members(0.0, 0.0)
    state = _StallingState(members, stall=2 * T)
    t0 = time.monotonic()
    # nobody beats: both are silent; the stall only delays their loss, by the timeout
    assert sorted(asyncio.run(_lost_after(state, 4 * T))) == [0, 1]
    assert time.monotonic() - t0 < 5 * T
