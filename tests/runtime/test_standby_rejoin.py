"""A standby whose coordinator goes away registers with its restart and goes on following,
instead of exiting — which deleted its replicas, so its next process followed from
scratch (seeding from MinIO, then the primary shipping everything since) and a primary lost
meanwhile found no standby holding its state (the ``pauses`` series: every standby exited
with code 78 when the coordinator was paused and killed).

``worker.protocols.standby.run_standby`` over a real channel to a coordinator's stand-in;
the followers aim at a dead primary and MinIO refuses connections (as in
``test_standby_leftovers.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import pytest

from sfaas.errors import StartAgain
from sfaas.runtime import channels, wire
from sfaas.runtime.settings import Settings
from tests.runtime.apps.ledger import app
from tests.runtime.test_standby_leftovers import SECRET, _follow
from tests.runtime.test_standby_leftovers import settings as settings  # noqa: F401 (fixture)
from worker.links import CoordinatorLink
from worker.protocols import standby

pytestmark = pytest.mark.usefixtures("watchdog")  # (tests/conftest.py: a hang fails fast)


async def _stand_by_through_a_coordinator_restart(
        settings: Settings, rejoin: bool, counts: dict[str, int], heard: list[str],
        restart_answers: wire.Message | None = None) -> None:
    """The stand-in answers the first Register with a Follow, then closes the channel (its
    process died); the second Register (the restart) gets, after 0.5 s (two heartbeat
    intervals), ``restart_answers`` or the same Follow with a Promote in the same frame.
    ``heard`` gets what each connection heard before its answer, ``counts`` how many
    stores the promotion gave."""
    follow = _follow()

    async def coordinator(chan: channels.Channel) -> None:
        msg = (await chan.recv())[0]
        first = not heard
        assert isinstance(msg, wire.Register)
        heard.append(f"Register(standby_of={msg.standby_of}, replicas={msg.replicas})")
        if first:
            chan.send(follow)
            await asyncio.sleep(0.3)  # (the standby follows meanwhile)
            chan.close()
            return
        async def listen() -> None:  # (what else comes before the answer)
            while True:
                heard.extend(type(m).__name__ for m in await chan.recv())

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(listen(), 0.5)
        if restart_answers is not None:
            chan.send(restart_answers)
        else:
            chan.send(follow)
            chan.send(wire.Promote(0, 4, list(follow.owned)))
        await asyncio.sleep(5)

    server = await channels.serve("127.0.0.1", 0, SECRET, coordinator)
    port = server.sockets[0].getsockname()[1]
    up = CoordinatorLink(SECRET)

    async def register(standby_of: int = -1, replicas: bool = False) -> list[wire.Message]:
        await up.connect("127.0.0.1", port)
        up.send(wire.Register("standby-0", "127.0.0.1", 1, os.getpid(), -1, standby_of, 2,
                              replicas=replicas or None))
        return await up.recv()

    first = (await register())[0]  # (any role: the coordinator chose the slot to follow)
    assert isinstance(first, wire.Follow)
    try:
        stores, index = await standby.run_standby(settings, app, "standby-0", SECRET, up, first,
                                                  register if rejoin else None)
        assert index == 0
        counts["stores promoted"] = len(stores)
        stores.close()
    finally:
        up.close()
        server.close()


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often a store's follower is opened (``"followers opened"``)."""
    counts = {"followers opened": 0, "stores promoted": 0}
    opened = standby._Standby._follow

    def counted(self: Any, *a: Any) -> Any:
        counts["followers opened"] += 1
        return opened(self, *a)

    monkeypatch.setattr(standby._Standby, "_follow", counted)
    return counts


def test_a_standby_registers_with_the_restarted_coordinator_and_keeps_following(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    counts = _counting(monkeypatch)
    heard: list[str] = []
    asyncio.run(_stand_by_through_a_coordinator_restart(settings, True, counts, heard))
    # the restart is asked for the slot followed only (never a primary's slot, which a
    # restarted coordinator whose primaries had not rejoined yet gave away), and hears no
    # heartbeat before its Follow came
    assert heard == ["Register(standby_of=-1, replicas=None)",
                     f"Register(standby_of={_follow().index}, replicas=True)"]
    n = len(app.operators) * len(_follow().owned)
    assert counts == {"followers opened": n, "stores promoted": n}  # (not opened again)


def test_without_a_way_to_register_again_the_standby_starts_over(
        settings: Settings) -> None:  # noqa: F811
    with pytest.raises(StartAgain, match="lost the coordinator while standing by"):
        asyncio.run(_stand_by_through_a_coordinator_restart(settings, False, {}, []))


def test_a_restarted_coordinator_that_gives_the_slot_away_ends_the_standby(
        settings: Settings) -> None:  # noqa: F811
    """The slot lost its primary meanwhile and the restart answers with the slot itself:
    the standby starts over (a fresh process takes it) — and sent no standby heartbeat on
    that channel, which the coordinator would take for a protocol error of the slot's."""
    heard: list[str] = []
    assign = wire.Assign(0, 2, [wire.Peer("127.0.0.1", 1, 7)] * 2, 4, "in", "out", "g",
                         [0, 1, 0, 1], 9)
    with pytest.raises(StartAgain, match="answered Assign"):
        asyncio.run(_stand_by_through_a_coordinator_restart(settings, True, {}, heard, assign))
    assert heard == ["Register(standby_of=-1, replicas=None)",
                     f"Register(standby_of={_follow().index}, replicas=True)"]


def test_a_coordinator_back_from_a_cut_promotes_the_standby_of_a_lost_slot_at_once(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The coordinator came back (a cut healed) with the slot lost and answers the standby,
    which said it holds the slot's replicas, with a ``Promote`` alone: the standby takes
    the slot with the replicas it kept, instead of leaving (seed 7 of the nemesis: the
    standbys were handed their slots as replacements, left, and the primaries were
    refused meanwhile)."""
    counts = _counting(monkeypatch)
    heard: list[str] = []
    promote = wire.Promote(0, 4, list(_follow().owned))
    asyncio.run(_stand_by_through_a_coordinator_restart(settings, True, counts, heard, promote))
    assert heard == ["Register(standby_of=-1, replicas=None)",
                     f"Register(standby_of={_follow().index}, replicas=True)"]
    n = len(app.operators) * len(_follow().owned)
    assert counts == {"followers opened": n, "stores promoted": n}
