"""A worker rejoining its restarted coordinator waits for it again when the coordinator
goes away before answering (killed again while restarting), instead of leaving: it keeps
its process and its stores (``worker.membership.Membership.rejoin``). Over real
authenticated channels to an in-process coordinator's stand-in; the other parts are fakes
of their seams."""

from __future__ import annotations

import asyncio
import socket
import time
from types import SimpleNamespace
from typing import Any

import pytest

from sfaas.errors import ChannelClosed
from sfaas.runtime import channels, wire
from sfaas.runtime.settings import Settings
from worker.links import CoordinatorLink, PeerLinks
from worker.membership import REJOIN_PEER_PATIENCE, Membership

pytestmark = pytest.mark.usefixtures("watchdog")  # (tests/conftest.py: a hang fails fast)

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


class _Ran:
    """An engine that ran epochs: the restarted coordinator recovers before any epoch."""

    epoch = 12


async def _rejoin_with_a_dead_peer(ran: bool) -> tuple[bool, float, list[wire.Message]]:
    """Rejoin when the Assign names peer 0 at an address nobody listens on any more (it
    was killed during the rejoin); returns the verdict, how long it took, and what the
    coordinator's stand-in heard after its Assign."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    heard: list[wire.Message] = []

    async def coordinator(chan: channels.Channel) -> None:
        assert isinstance((await chan.recv())[0], wire.Register)
        peers = [wire.Peer("127.0.0.1", dead, 7), wire.Peer("127.0.0.1", 1000, 8)]
        chan.send(wire.Assign(1, 2, peers, 4, "in", "out", "group", [0, 1, 0, 1], 8))
        try:
            heard.extend(await chan.recv())
        except ChannelClosed:
            pass

    server = await channels.serve("127.0.0.1", 0, SECRET, coordinator)
    port = server.sockets[0].getsockname()[1]
    settings = Settings.load({"coordinator": f"127.0.0.1:{port}", "secret": SECRET})
    state, up = _State(), CoordinatorLink(SECRET)
    state.engine = _Ran() if ran else None  # type: ignore[assignment]
    links = PeerLinks(SECRET, 3.5)  # (the worker's: 2 heartbeat timeouts + 2 s)
    m = Membership(settings, SimpleNamespace(name="app"), "worker-1", SECRET, state,  # type: ignore[arg-type]
                   uplink=up, links=links, kafka=None, moving=None, egress=None)  # type: ignore[arg-type]
    t0 = time.monotonic()
    try:
        ok = await asyncio.wait_for(m.rejoin(1000, 1001), 30)
        took = time.monotonic() - t0
        await asyncio.sleep(0.1)  # (the Ready reaches the stand-in)
    finally:
        up.close()
        links.close()
        server.close()
    return ok, took, heard


def test_a_peer_gone_during_the_rejoin_is_left_to_the_recovery_that_follows() -> None:
    ok, took, heard = asyncio.run(_rejoin_with_a_dead_peer(ran=True))
    assert ok and [type(m).__name__ for m in heard] == ["Ready"]
    assert took < REJOIN_PEER_PATIENCE + 1.5, took  # (not the links' 3.5 s, then a restart)


def test_without_epochs_run_a_rejoin_still_needs_every_peer() -> None:
    """No recovery follows a restarted coordinator when nothing ran: epochs would begin
    with a peer missing, so the rejoin fails and the process starts again."""
    ok, took, heard = asyncio.run(_rejoin_with_a_dead_peer(ran=False))
    assert not ok and heard == [] and took >= 3.5
