"""A channel between two workers that breaks while both stay members (``wire.PeerBroken``).

What it carried — calls, their results, a leased run's reports — may be lost, and the epoch
waiting for them would wait for ever while both workers heartbeat the coordinator: the
simulator found every run stalled after a cut between two workers (13 of 30 seeds; all 100
pass with this, ``tests/sim/test_peer_cut.py``). So the worker serving a channel that closes
tells the coordinator, which recovers unless the report is stale; and the recovery's
rollback replaces a channel whose connection is gone even if nothing ever read from it
(``Channel.lost``)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from coordinator.membership import Membership
from coordinator.state import Member
from sfaas.errors import ChannelClosed
from sfaas.runtime import channels, wire
from worker.calls import PeerCalls
from worker.links import PeerLinks

SECRET = "peer-broken-secret-0123456789"


pytestmark = pytest.mark.usefixtures("watchdog")  # (tests/conftest.py: a hang fails fast)


# -- the worker that served the channel tells the coordinator ----------------------------------
class _Chan:
    """A peer's channel: its frames, then the end of the stream."""

    peer = "10.0.0.2:4000"

    def __init__(self, *frames: list[wire.Message]) -> None:
        self._frames = list(frames)
        self.gate = None
        self.closed = False

    async def recv(self) -> list[wire.Message]:
        if not self._frames:
            raise ChannelClosed("channel to 10.0.0.2:4000 closed: reset (test)")
        return self._frames.pop(0)

    def close(self) -> None:
        self.closed = True


def _calls(peer_generation: int) -> tuple[PeerCalls, list[tuple[int, int]]]:
    told: list[tuple[int, int]] = []
    assigned = asyncio.Event()
    assigned.set()
    state: Any = SimpleNamespace(index=0, n_workers=2, assigned=assigned,
                                 peer_generation=lambda i: peer_generation)
    settings: Any = SimpleNamespace(max_batch=100, heartbeat_timeout=1.0)
    links: Any = SimpleNamespace(gate=None)
    fallback: Any = SimpleNamespace(held=0)
    calls = PeerCalls(settings, state, links, fallback, SimpleNamespace(),  # type: ignore[arg-type]
                      broken=lambda peer, gen: told.append((peer, gen)))
    return calls, told


def test_a_current_peers_channel_that_closes_is_reported() -> None:
    calls, told = _calls(peer_generation=5)
    chan = _Chan([wire.Hello(1, 5)])
    with pytest.raises(ChannelClosed):
        asyncio.run(calls.serve(chan))  # type: ignore[arg-type]
    assert told == [(1, 5)]


def test_a_fenced_processes_channel_is_refused_not_reported() -> None:
    calls, told = _calls(peer_generation=6)  # the membership names a newer generation
    chan = _Chan([wire.Hello(1, 5)])
    asyncio.run(calls.serve(chan))  # type: ignore[arg-type]
    assert chan.closed and told == []


# -- the coordinator recovers, unless the report is stale -----------------------------------------
def _membership(recoveries: int, rescaling: bool = False
                ) -> tuple[Membership, list[str], list[Member]]:
    happened: list[str] = []
    members = [Member(i, f"worker-{i}", "h", 1, 100 + i, SimpleNamespace())  # type: ignore[arg-type]
               for i in range(2)]
    for i, m in enumerate(members):
        m.generation = 10 + i
    state: Any = SimpleNamespace(members=members, recoveries=recoveries)
    inbox: Any = SimpleNamespace(interrupt=lambda: happened.append("recover"))
    events: Any = SimpleNamespace(member_lost=lambda why: happened.append(f"round aborted: {why}"))
    rescale: Any = SimpleNamespace(under_way=lambda: rescaling)
    m = Membership(state, inbox, SimpleNamespace(), rescale,  # type: ignore[arg-type]
                   events, topics=("in", "out", "group"))
    return m, happened, members


def test_the_coordinator_recovers_on_a_current_report() -> None:
    m, happened, members = _membership(recoveries=3)
    m.peer_broken(members[0], wire.PeerBroken(0, 1, 11, 3))
    assert happened == ["round aborted: worker 0's channel from worker 1 closed", "recover"]


@pytest.mark.parametrize("why,report", [
    ("an earlier recovery's epochs", wire.PeerBroken(0, 1, 11, 2)),
    ("the peer was replaced (another generation)", wire.PeerBroken(0, 1, 9, 3)),
    ("the peer left the membership", wire.PeerBroken(0, 2, 12, 3)),
])
def test_a_stale_report_changes_nothing(why: str, report: wire.PeerBroken) -> None:
    m, happened, members = _membership(recoveries=3)
    m.peer_broken(members[0], report)
    assert happened == [], why


def test_a_report_of_a_peer_already_lost_changes_nothing() -> None:
    m, happened, members = _membership(recoveries=3)
    members[1].alive = False  # (its loss started the recovery already)
    m.peer_broken(members[0], wire.PeerBroken(0, 1, 11, 3))
    assert happened == []


def test_a_rescale_closes_channels_on_purpose_and_recovers_nothing() -> None:
    """A scale-down's switch: the remaining workers close their channels to the retired
    one, which reports it (it is no longer a member); and during the switch itself."""
    m, happened, members = _membership(recoveries=3)
    retired = Member(2, "worker-2", "h", 1, 102, SimpleNamespace())  # type: ignore[arg-type]
    m.peer_broken(retired, wire.PeerBroken(2, 0, 10, 3))
    assert happened == []
    m, happened, members = _membership(recoveries=3, rescaling=True)
    m.peer_broken(members[0], wire.PeerBroken(0, 1, 11, 3))
    assert happened == []


def test_the_message_round_trips_through_the_codec() -> None:
    msg = wire.PeerBroken(1, 0, 1798761600101095, 4)
    assert wire.decode_frame(wire.join_frame([wire.encode_message(msg)])) == [msg]


# -- a channel only written to learns its connection is gone ---------------------------------------
def test_a_reset_connection_makes_the_written_channel_lost_and_it_is_replaced() -> None:
    async def go() -> None:
        served: list[channels.Channel] = []

        async def peer(ch: channels.Channel) -> None:
            served.append(ch)
            await ch.recv()  # the Hello
            ch._writer.transport.abort()  # a reset, as a peer's host or a middlebox sends

        server = await channels.serve("127.0.0.1", 0, SECRET, peer)
        port = server.sockets[0].getsockname()[1]
        links = PeerLinks(SECRET, 5.0)
        peers = [["127.0.0.1", 0], ["127.0.0.1", port]]
        try:
            await links.connect(peers, 0)
            first = links.channels[1]
            for _ in range(200):
                if first.lost:
                    break
                await asyncio.sleep(0.01)
            assert first.lost and not first.closed  # (nothing read it: only the transport knows)
            await links.connect(peers, 0)  # the rollback's reconnect
            assert links.channels[1] is not first and not links.channels[1].lost
        finally:
            links.close()
            server.close()

    asyncio.run(asyncio.wait_for(go(), 30))


# -- a call of an epoch a recovery interrupted carries that epoch's recovery ------------------------
class _Sent:
    def __init__(self) -> None:
        self.sent: list[wire.Message] = []

    def send(self, msg: wire.Message) -> None:
        self.sent.append(msg)

    async def wait_room(self) -> None:
        return None


def test_a_call_of_an_interrupted_epoch_carries_the_recovery_it_began_under() -> None:
    """The simulator's seed 191 (``--cut 0.52,1.75 --slow 0.46,2.15,worker-0,coordinator,1``
    on the driven replay): a worker's recovery began (``recovering``) while its lost epoch's
    roots still ran; their calls left stamped with the *new* recovery, a peer that had
    rolled back already took them for its replay's, and the replay's call counters never
    matched. Stamped with the epoch's own, the peer drops them."""
    from worker.state import WorkerState

    st = WorkerState(max_batch=10, local_fallback=False)
    st.index, st.n_workers = 0, 2
    st.engine = SimpleNamespace(epoch=7, in_fallback=False)  # type: ignore[assignment]
    st.recovering(3)
    st.epoch_began(replay=False)  # epoch 7 begins under recovery 3
    st.recovering(4)  # a recovery starts; epoch 7's roots are still running
    chan = _Sent()
    links: Any = SimpleNamespace(channels={1: chan}, gate=None)
    calls = PeerCalls(SimpleNamespace(max_batch=10), st, links,  # type: ignore[arg-type]
                      SimpleNamespace(held=0), SimpleNamespace())  # type: ignore[arg-type]
    calls.sent = [0, 0]

    async def call() -> None:
        task = asyncio.ensure_future(calls.remote_call(1, 5, 1.0, "accounts", "a", "credit",
                                                       [1], 0))
        await asyncio.sleep(0)
        task.cancel()

    asyncio.run(call())
    (msg,) = chan.sent
    assert isinstance(msg, wire.Call) and msg.recovery == 3
    # and a peer that rolled back for recovery 4 drops it
    peer = WorkerState(max_batch=10, local_fallback=False)
    peer.recovering(4)
    peer.engine = SimpleNamespace(epoch=7)  # type: ignore[assignment]
    served: list[Any] = []
    peer_calls = PeerCalls(SimpleNamespace(max_batch=10), peer, links,  # type: ignore[arg-type]
                           SimpleNamespace(held=0), SimpleNamespace(spawn=served.append))  # type: ignore[arg-type]
    peer_calls.on_call(msg)
    assert served == [] and peer_calls.deferred_n == 0
