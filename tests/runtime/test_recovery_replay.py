"""The coordinator's side of a recovery's replay (``coordinator.protocols.recovery``): the
logged epochs go to the workers in one ``ReplayLogged`` each, which replay them as a lease
(``worker.protocols.lease``, tested in ``test_lease``), and the replay is over once every
worker answered ``Replayed`` — a constant number of coordinator messages, whatever the
number of logged epochs, where a Begin and a Commit per epoch went before."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from coordinator.inbox import Inbox
from coordinator.protocols.recovery import Recovery, _Retry
from sfaas.runtime import wire


class _Channel:
    def __init__(self) -> None:
        self.sent: list[wire.Message] = []

    def send(self, msg: wire.Message) -> None:
        self.sent.append(msg)


def _recovery(n: int) -> tuple[Recovery, Inbox, list[_Channel], list[int]]:
    chans = [_Channel() for _ in range(n)]
    reached: list[int] = []
    state: Any = SimpleNamespace(
        members=[SimpleNamespace(index=i, channel=c) for i, c in enumerate(chans)],
        reach_epoch=reached.append)
    inbox = Inbox()
    rec = Recovery(state, inbox, lambda: None, SimpleNamespace())  # type: ignore[arg-type]
    return rec, inbox, chans, reached


@pytest.mark.parametrize("k", [1, 7, 300])
def test_a_replay_of_k_epochs_costs_one_message_each_way_per_worker(k: int) -> None:
    epochs = [wire.LoggedEpoch(10 + 2 * i, 100.0 + i) for i in range(k)]

    async def go() -> tuple[list[_Channel], list[int]]:
        rec, inbox, chans, reached = _recovery(3)
        task = asyncio.ensure_future(rec._replay(4, epochs))
        await asyncio.sleep(0)
        # a late report of the lost epoch, an answer of an abandoned attempt: not the end
        await inbox.put(wire.Report(9, 0, 0, [], [], [0, 0, 0], [0, 0, 0], 0, 0))
        await inbox.put(wire.Replayed(3, 0, epochs[-1].epoch))
        for i in (2, 0):
            await inbox.put(wire.Replayed(4, i, epochs[-1].epoch))
        await asyncio.sleep(0.01)
        assert not task.done(), "the replay ended before every worker answered"
        await inbox.put(wire.Replayed(4, 1, epochs[-1].epoch))
        await asyncio.wait_for(task, 5)
        return chans, reached

    chans, reached = asyncio.run(go())
    for c in chans:
        assert len(c.sent) == 1, [type(m).__name__ for m in c.sent[:5]]
        (msg,) = c.sent
        assert isinstance(msg, wire.ReplayLogged) and msg.attempt == 4 and msg.epochs == epochs
    assert len({c.sent[0].run for c in chans}) == 1  # type: ignore[attr-defined]
    assert reached == [epochs[-1].epoch]  # live epochs are numbered above the replayed ones


def test_a_loss_during_the_replay_starts_the_recovery_over() -> None:
    async def go() -> None:
        rec, inbox, _chans, reached = _recovery(2)
        task = asyncio.ensure_future(rec._replay(1, [wire.LoggedEpoch(5, 1.0)]))
        await inbox.put(wire.Replayed(1, 0, 5))
        inbox.interrupt()
        with pytest.raises(_Retry):
            await asyncio.wait_for(task, 5)
        assert reached == []

    asyncio.run(go())


def test_nothing_to_replay_sends_nothing() -> None:
    async def go() -> list[_Channel]:
        rec, _inbox, chans, _reached = _recovery(2)
        await asyncio.wait_for(rec._replay(1, []), 5)
        return chans

    assert all(not c.sent for c in asyncio.run(go()))
