"""A worker rejoining the coordinator with its state takes its own lost slot or none
(``coordinator.membership.Membership.register``): it leaves on any other
(``worker.membership.Membership.rejoin``), and the slot it took is lost to that slot's own
worker meanwhile. After the nemesis' coordinator cut (seed 101) the returning workers and the
standbys took each other's slots, each left and came back: a 15 s gap."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from coordinator.membership import Membership
from coordinator.state import ClusterState, Member
from sfaas.runtime import wire

pytestmark = pytest.mark.usefixtures("watchdog")  # (tests/conftest.py: a hang fails fast)


class _Chan:
    def __init__(self) -> None:
        self.sent: list[wire.Message] = []

        self.closed = False

    def send(self, msg: wire.Message) -> None:
        self.sent.append(msg)

    def close(self) -> None:
        self.closed = True

    async def drain(self) -> None:
        pass

    async def recv(self) -> list[wire.Message]:
        await asyncio.sleep(3600)
        return []


def _cluster(lost: list[int], reserved: dict[int, str],
             promoted: list[int] | None = None) -> tuple[Membership, ClusterState]:
    """Three slots, ``lost`` of them lost; ``reserved``: a lost slot → the promoted standby
    it waits for; ``promoted``: the slots whose standby a loss promoted."""
    state = ClusterState(3)
    for i in range(3):
        state.add_member(Member(i, f"worker-{i}", "h", 7700 + i, 100 + i,
                                _Chan()))  # type: ignore[arg-type]
    for i in lost:
        state.members[i].alive = False
    standbys: Any = SimpleNamespace(
        slot_for=lambda reg: None, registered=lambda slot, name: None,
        reserved_for=lambda slot: reserved.get(slot),
        promote=lambda slot: (promoted if promoted is not None else []).append(slot))
    rescale: Any = SimpleNamespace(wants_joiner=lambda: False, is_joiner=lambda m: False,
                                   abandon=lambda why: None)
    events: Any = SimpleNamespace(member_lost=lambda why: None, changed=lambda: None)
    inbox: Any = SimpleNamespace(interrupt=lambda: None)
    return Membership(state, inbox, standbys, rescale, events, topics=("in", "out", "g")), state


async def _register(m: Membership, reg: wire.Register) -> _Chan:
    chan = _Chan()
    task = asyncio.ensure_future(m.register(reg, chan))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return chan


def test_a_rejoining_worker_whose_slot_waits_for_its_standby_takes_no_other() -> None:
    m, state = _cluster(lost=[0, 1], reserved={0: "worker-0-standby"})
    chan = asyncio.run(_register(m, wire.Register("worker-0", "h", 7800, 200, 0, -1, 0, 42)))
    assert [type(x).__name__ for x in chan.sent] == ["Stop"]
    assert "slot 0 is not free" in chan.sent[0].reason  # type: ignore[attr-defined]
    assert not state.members[1].alive  # (slot 1 stays for its own worker)


def test_a_rejoining_worker_takes_its_own_lost_slot() -> None:
    m, state = _cluster(lost=[0, 1], reserved={})
    asyncio.run(_register(m, wire.Register("worker-1", "h", 7801, 201, 1, -1, 0, 42)))
    assert state.members[1].alive and state.members[1].pid == 201
    assert not state.members[0].alive


def test_a_fresh_worker_still_takes_any_lost_slot() -> None:
    m, state = _cluster(lost=[1], reserved={})
    asyncio.run(_register(m, wire.Register("spare", "h", 7802, 202, 0, -1, 0, 0)))
    assert state.members[1].alive and state.members[1].pid == 202


def test_a_worker_registering_again_in_the_slot_it_holds_takes_it_back() -> None:
    """The coordinator still holds slot 0's process alive (its old channel not closed: a
    FIN lost in a cut) when that process — the same name and pid — registers again in it:
    the old channel is stale and closed, the slot is the registrant's again and its standby
    is not promoted. It used to be refused, or given another lost slot, and its own slot was
    lost when the old channel closed (the nemesis' seed 4)."""
    promoted: list[int] = []
    m, state = _cluster(lost=[2], reserved={}, promoted=promoted)
    old = state.members[0].channel
    gen = state.members[0].generation
    chan = asyncio.run(_register(m, wire.Register("worker-0", "h", 7900, 100, 0, -1, 0, 42)))
    assert state.members[0].alive and state.members[0].port == 7900
    assert state.members[0].generation != gen and old.closed  # type: ignore[attr-defined]
    assert not state.members[2].alive and promoted == []  # (slot 2 waits for its own)
    assert not any(isinstance(x, wire.Stop) for x in chan.sent)
    # another process naming slot 0 (a different pid) does not take it from its holder
    chan = asyncio.run(_register(m, wire.Register("worker-0", "h", 7901, 999, 0, -1, 0, 42)))
    assert [type(x).__name__ for x in chan.sent] == ["Stop"] and state.members[0].port == 7900
