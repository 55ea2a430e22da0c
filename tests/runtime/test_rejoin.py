"""A worker rejoining its restarted coordinator waits for it again when the coordinator
goes away before answering (killed again while restarting), instead of leaving: it keeps
its process and its stores (``worker.membership.Membership.rejoin``). Over real
authenticated channels to an in-process coordinator's stand-in; the other parts are fakes
of their seams."""

from __future__ import annotations

import asyncio
import faulthandler
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from sfaas.runtime import channels, wire
from sfaas.runtime.settings import Settings
from worker.links import CoordinatorLink
from worker.membership import Membership


@pytest.fixture(autouse=True)
def _watchdog() -> Iterator[None]:
    """A hang fails fast (per test: a module-level timer would end the whole session)."""
    faulthandler.dump_traceback_later(60, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()

SECRET = "rejoin-test-secret-0123456789"


class _State:
    """The slot a worker held before its coordinator restarted."""

    index, n_workers, engine, generation = 1, 2, None, 5

    def __init__(self) -> None:
        self.adopted: list[wire.Assign] = []

    def same_slot(self, a: wire.Assign) -> bool:
        return a.index == self.index and a.n_workers == self.n_workers

    def adopt(self, a: wire.Assign) -> None:
        self.adopted.append(a)
        self.generation = a.generation


class _Links:
    generation = 0

    async def connect(self, peers: Any, index: int) -> None:
        self.connected = (len(peers), index)


def _assign(index: int) -> wire.Assign:
    peers = [wire.Peer("127.0.0.1", 1, 7), wire.Peer("127.0.0.1", 2, 8)]
    return wire.Assign(index, 2, peers, 4, "in", "out", "group", [0, 1, 0, 1], 8)


async def _rejoin(answers: list[wire.Assign | None]) -> tuple[bool, _State, int]:
    """Rejoin a coordinator stand-in that takes the Register on each connection and then
    closes it unanswered (None) or answers with the next of ``answers``."""
    registers = 0

    async def coordinator(chan: channels.Channel) -> None:
        nonlocal registers
        msgs = await chan.recv()
        assert isinstance(msgs[0], wire.Register)
        registers += 1
        answer = answers.pop(0)
        if answer is None:
            chan.close()  # (killed before it answered)
            return
        chan.send(answer)
        await chan.recv()  # (Ready)

    server = await channels.serve("127.0.0.1", 0, SECRET, coordinator)
    port = server.sockets[0].getsockname()[1]
    settings = Settings.load({"coordinator": f"127.0.0.1:{port}", "secret": SECRET})
    state, up = _State(), CoordinatorLink(SECRET)
    m = Membership(settings, SimpleNamespace(name="app"), "worker-1", SECRET, state,  # type: ignore[arg-type]
                   uplink=up, links=_Links(), kafka=None, moving=None, egress=None)  # type: ignore[arg-type]
    try:
        ok = await asyncio.wait_for(m.rejoin(1000, 1001), 30)
    finally:
        up.close()
        server.close()
    return ok, state, registers


def test_a_coordinator_gone_again_before_it_answers_is_waited_for() -> None:
    ok, state, registers = asyncio.run(_rejoin([None, None, _assign(1)]))
    assert ok and registers == 3
    assert [a.index for a in state.adopted] == [1] and state.generation == 8


def test_a_coordinator_that_gives_the_slot_away_is_left() -> None:
    ok, state, registers = asyncio.run(_rejoin([None, _assign(0)]))
    assert not ok and registers == 2 and state.adopted == []
